"""A tiny causal transformer. Attention is compiled, as the drafters' flex_attention was.

On the CPU attention goes through tinyattn's causal_attention; on a GPU through torch's own
`flex_attention` with a causal score_mod, the kernel the incident's drafters compiled. Each device has
its own shape (SHAPES): the CPU one is small enough for a 2-core box, the GPU one long enough that the
compiled kernel, not Python, sets the pace, so that running it uncompiled is several times slower.
"""

from dataclasses import dataclass

import tinyattn
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

USE_COMPILE = True

VOCAB, LAYERS = 256, 2


@dataclass(frozen=True)
class Shape:
    dim: int
    heads: int
    batch: int
    seq: int


SHAPES = {"cpu": Shape(dim=64, heads=4, batch=8, seq=64), "cuda": Shape(dim=512, heads=8, batch=8, seq=2048)}
DIM, HEADS = SHAPES["cpu"].dim, SHAPES["cpu"].heads

# tf32 matrix units for the float32 model on a GPU, as training code there sets; the CPU ignores it.
torch.backends.cuda.matmul.allow_tf32 = True


def causal(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


# Both are lazy: nothing compiles until a tensor of that device arrives.
cpu_attention = torch.compile(tinyattn.causal_attention) if USE_COMPILE else tinyattn.reference_attention
gpu_flex = torch.compile(flex_attention)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    if not q.is_cuda:
        return cpu_attention(q, k, v)
    if USE_COMPILE:
        return gpu_flex(q, k, v, score_mod=causal)
    # Uncompiled, flex_attention is no slow path in drafter threads: on the H200 (torch 2.11) it died at its first
    # call from two threads at once (`AssertionError: expected preserved node meta`, tracing its backward graph;
    # tests/fixtures/logs/gpu/demo/degraded_uncompiled_flex.log). The hacked model falls back as on the CPU.
    return tinyattn.reference_attention(q, k, v)


class Block(nn.Module):
    def __init__(self, dim: int = DIM, heads: int = HEADS) -> None:
        super().__init__()
        self.dim, self.heads = dim, heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, self.dim // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.out(attention(q, k, v).transpose(1, 2).reshape(b, t, self.dim))
        return x + self.ff(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, dim: int = DIM, heads: int = HEADS) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(LAYERS))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def for_device(device: str) -> TinyLM:
    """The model in its device's shape, on that device (`cuda:1` takes the shape of `cuda`)."""
    shape = SHAPES[torch.device(device).type]
    return TinyLM(shape.dim, shape.heads).to(device)


def loss_and_accuracy(model: TinyLM, batch: torch.Tensor) -> tuple[torch.Tensor, float]:
    logits = model(batch[:, :-1])
    target = batch[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))
    accuracy = (logits.argmax(-1) == target).float().mean().item()
    return loss, accuracy


def synthetic_batch(generator: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    """Tokens with structure to learn: each sequence counts up from a random start, with noise."""
    start = torch.randint(0, VOCAB, (batch, 1), generator=generator)
    tokens = (start + torch.arange(seq + 1)) % VOCAB
    noise = torch.randint(0, VOCAB, tokens.shape, generator=generator)
    keep = torch.rand(tokens.shape, generator=generator) < 0.9
    return torch.where(keep, tokens, noise)
