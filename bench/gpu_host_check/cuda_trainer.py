"""A small CUDA trainer: compiled flex_attention, forward and backward, step lines like the incident's."""

import time

import torch
from torch.nn.attention.flex_attention import flex_attention

print("loading", flush=True)
attn = torch.compile(flex_attention)
B, H, S, D = 4, 16, 2048, 64
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
ballast = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")  # hold 8 GiB like a model would
step, tick = 0, time.monotonic()
while True:
    for _ in range(20):
        attn(q, k, v).sum().backward()
    torch.cuda.synchronize()
    step += 1
    now = time.monotonic()
    print(f"step={step} loss=1.0000 acc=0.100 lr=3.96e-04 | dft={1 / (now - tick):.2f}b/s ({20 * B * S / (now - tick) / 1000:.1f}Ktok/s) | q_hs=[1]", flush=True)
    tick = now
