"""tinyaccel 1.0.0: device placement for the demo trainer (stands in for accelerate)."""

__version__ = "1.0.0"


def place(module, device: str):
    return module.to(device)
