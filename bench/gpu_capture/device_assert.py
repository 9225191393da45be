"""A few normal CUDA training steps, then a batch with a token id past the embedding table.

The embedding lookup's bounds check fires on the GPU (CUDA_LAUNCH_BLOCKING left unset), so the
kernel's `Assertion ... failed` lines and then `CUDA error: device-side assert triggered` appear
the way a real trainer prints them. Usage: python3 -u device_assert.py [--device cuda]"""
import argparse
import time

import torch
import torch.nn.functional as F

from _steps import step_line

p = argparse.ArgumentParser()
p.add_argument("--first-step", type=int, default=1207)
p.add_argument("--good-steps", type=int, default=5)
p.add_argument("--device", default="cuda")
a = p.parse_args()

torch.manual_seed(0)
V, D, B, S = 32000, 256, 16, 256
dev = torch.device(a.device)
model = torch.nn.Sequential(torch.nn.Embedding(V, D), torch.nn.Linear(D, D), torch.nn.GELU(), torch.nn.Linear(D, V)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
print(f"loading model: vocab={V} dim={D} on {dev} (batch={B} seq={S})", flush=True)
for step in range(a.first_step, a.first_step + a.good_steps + 1):
    t0 = time.perf_counter()
    x = torch.randint(0, V, (B, S), device=dev)
    if step == a.first_step + a.good_steps:
        x[3, 17] = V + 5  # a tokenizer with more ids than the model's vocabulary
    y = torch.roll(x, -1, dims=1).clamp(max=V - 1)
    loss = F.cross_entropy(model(x).view(-1, V), y.view(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    step_line(step, loss.item(), B * S / (time.perf_counter() - t0), seed=5)
