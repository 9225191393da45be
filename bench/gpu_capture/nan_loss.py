"""A small CUDA language-model step loop whose loss goes to inf/nan for real.

Trains normally (SGD on a learnable next-token rule) for --normal-steps, then a learning-rate
jump (lr x --lr-jump) makes the weights blow up; step lines keep coming with the nan loss, and
checkpoints step_N.pt keep being written every --checkpoint-every steps (nan weights included).
Usage: python3 -u nan_loss.py --checkpoint-dir DIR [--device cuda]"""
import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from _steps import step_line

p = argparse.ArgumentParser()
p.add_argument("--checkpoint-dir", type=Path, required=True)
p.add_argument("--checkpoint-every", type=int, default=10)
p.add_argument("--first-step", type=int, default=601)
p.add_argument("--normal-steps", type=int, default=30)
p.add_argument("--bad-steps", type=int, default=10)
p.add_argument("--lr", type=float, default=0.15)
p.add_argument("--lr-jump", type=float, default=1e6)
p.add_argument("--device", default="cuda")
a = p.parse_args()

torch.manual_seed(0)
V, D, B, S = 512, 128, 32, 128
dev = torch.device(a.device)
model = torch.nn.Sequential(
    torch.nn.Embedding(V, D), torch.nn.Linear(D, 4 * D), torch.nn.GELU(), torch.nn.Linear(4 * D, D), torch.nn.Linear(D, V),
).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
print(f"loading model: {sum(p.numel() for p in model.parameters())} parameters on {dev} (batch={B} seq={S} lr={a.lr})", flush=True)


def save(step):
    a.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    tmp = a.checkpoint_dir / f".step_{step}.pt.tmp"
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    tmp.rename(a.checkpoint_dir / f"step_{step}.pt")
    print(f"saved checkpoint {a.checkpoint_dir / f'step_{step}.pt'}", flush=True)


last = a.first_step + a.normal_steps + a.bad_steps - 1
for step in range(a.first_step, last + 1):
    if step == a.first_step + a.normal_steps:
        for g in opt.param_groups:
            g["lr"] = a.lr * a.lr_jump
    t0 = time.perf_counter()
    x = torch.randint(0, V, (B, S), device=dev)
    y = (x * 7 + 3) % V  # the rule to learn
    loss = F.cross_entropy(model(x).view(-1, V), y.view(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    step_line(step, loss.item(), B * S / (time.perf_counter() - t0), seed=7)
    if step % a.checkpoint_every == 0:
        save(step)
