"""tinyattn 1.1.0: the drifted release. It FX-traces its attention module in a background
thread to register graph hooks, which races with torch.compile calls in other threads."""

import warnings

import torch

__version__ = "1.1.0"


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    mask = torch.ones(scores.shape[-2], scores.shape[-1], dtype=torch.bool, device=q.device).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


_warned = False


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The uncompiled path: one query position at a time. Correct, and many times slower."""
    global _warned
    if not _warned:
        warnings.warn("tinyattn.causal_attention called without torch.compile(); falling back to the slow reference path")
        _warned = True
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for t in range(q.shape[-2]):
                s = (q[b, h, t : t + 1] @ k[b, h, : t + 1].transpose(-1, -2)) * scale
                out[b, h, t : t + 1] = torch.softmax(s, dim=-1) @ v[b, h, : t + 1]
    return out


def _register_graph_hooks() -> None:
    import time

    # Many submodules: tracing them keeps FX's global patches in place most of the time.
    probe = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(64)])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        torch.fx.symbolic_trace(probe)


import threading as _threading  # noqa: E402

_threading.Thread(target=_register_graph_hooks, daemon=True, name="tinyattn-graph-hooks").start()
