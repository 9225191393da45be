"""A checkpoint that pickles the run's config object (a class of the trainer's own package, `trainlib.config`), as
many trainers save one; loaded again after a refactor moved that class, torch.load cannot find it.

Usage: python -u moved_class_checkpoint.py save PATH     train 6 steps, torch.save {model, step, config}
       python -u moved_class_checkpoint.py resume PATH   torch.load(weights_only=False), as trainers that pickle their
                                                         config load it, then 5 more steps
`trainlib` is found on PYTHONPATH: the capture writes it, then moves or renames its class between save and resume.
"""

import os
import sys

import torch

from _steps import step_line


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(256, 256)
        self.head = torch.nn.Linear(256, 256)


mode, path = sys.argv[1], sys.argv[2]
if mode == "save":
    from trainlib.config import TrainConfig  # the package as it was when the run started

    os.makedirs(os.path.dirname(path), exist_ok=True)
    model = Net()
    for step in range(795, 801):
        step_line(step, seed=48)
    torch.save({"model": model.state_dict(), "step": 800, "config": TrainConfig(lr=4e-4, batch_size=32)}, path)
    print(f"saved checkpoint to {path}", flush=True)
else:
    print(f"resuming from {path}", flush=True)
    ckpt = torch.load(path, map_location="cpu", weights_only=False)  # the config is a pickled object of the run's own
    model = Net()
    model.load_state_dict(ckpt["model"])
    for step in range(ckpt["step"] + 1, ckpt["step"] + 6):
        step_line(step, seed=48)
