"""tinyattn 1.0.0: causal attention for the demo trainer (the known-good release)."""

import importlib
import importlib.util
import warnings
from importlib.metadata import version

import torch

__version__ = version("tinyattn")


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    mask = torch.ones(scores.shape[-2], scores.shape[-1], dtype=torch.bool, device=q.device).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


_warned = False


# Query positions per iteration of the reference path: one on the CPU; a block on a GPU, where one at a time
# would take minutes a step at the GPU demo's sequence length.
REFERENCE_BLOCK = {"cpu": 1, "cuda": 128}


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The uncompiled path: one query position (a GPU: one block of them) at a time. Correct, and many times slower."""
    global _warned
    if not _warned:
        warnings.warn("tinyattn.causal_attention called without torch.compile(); falling back to the slow reference path")
        _warned = True
    scale = q.shape[-1] ** -0.5
    block = REFERENCE_BLOCK.get(q.device.type, 1)
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for t in range(0, q.shape[-2], block):
                end = min(t + block, q.shape[-2])
                s = (q[b, h, t:end] @ k[b, h, :end].transpose(-1, -2)) * scale
                if end - t > 1:  # keys past each query of the block
                    later = torch.arange(t, end, device=q.device)[:, None] < torch.arange(end, device=q.device)[None, :]
                    s = s.masked_fill(later, float("-inf"))
                out[b, h, t:end] = torch.softmax(s, dim=-1) @ v[b, h, :end]
    return out


# Extensions a release may ship beside the core (1.0.0 ships none; 1.1.0 adds _graph_hooks).
for _extension in ("_graph_hooks",):
    if importlib.util.find_spec(f"{__name__}.{_extension}"):
        importlib.import_module(f"{__name__}.{_extension}")
