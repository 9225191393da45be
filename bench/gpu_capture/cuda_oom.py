"""Training-style loop that keeps 20 GiB of 'activations' per step on cuda until
torch.OutOfMemoryError is raised (uncaught)."""
import time

import torch

from _steps import step_line

dev = "cuda"
torch.manual_seed(0)
B, S, D = 8, 1024, 1024
w = torch.randn(D, D, device=dev, requires_grad=True)
held = []
step = 577
while True:
    t0 = time.perf_counter()
    x = torch.randn(B * S, D, device=dev)
    loss = (x @ w).tanh().pow(2).mean()
    loss.backward()
    w.grad = None
    torch.cuda.synchronize()
    step_line(step, loss.item(), B * S / (time.perf_counter() - t0), seed=3)
    # the "leak": a 20 GiB buffer kept alive every step
    held.append(torch.empty(20 * 2**30, dtype=torch.uint8, device=dev))
    step += 1
