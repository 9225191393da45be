"""A tiny causal transformer. Attention goes through tinyattn, compiled, as the drafters' flex_attention did."""

import tinyattn
import torch
import torch.nn as nn
import torch.nn.functional as F

USE_COMPILE = True

VOCAB, DIM, HEADS, LAYERS = 256, 64, 4, 2

attention = torch.compile(tinyattn.causal_attention) if USE_COMPILE else tinyattn.reference_attention


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.ff = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        x = x + self.out(attention(q, k, v).transpose(1, 2).reshape(b, t, DIM))
        return x + self.ff(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


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
