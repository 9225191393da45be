"""Training loop whose output folder is on a nearly full disk (a 2 MiB tmpfs in the capture).

Usage: python -u disk_full_trainer.py ckpt DIR   torch.save of a ~4 MiB checkpoint to DIR/step_600/model.pt
       python -u disk_full_trainer.py log DIR    per-step metrics + eval samples appended to files in DIR
Either way the disk fills during the write, for real; nothing here raises by hand.
"""
import json
import os
import sys

import torch

from _steps import step_line

mode, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(16)])  # ~4 MiB of fp32
opt = torch.optim.SGD(model.parameters(), lr=1e-3)

if mode == "ckpt":
    for step in range(595, 601):
        model(torch.randn(8, 256)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        step_line(step, seed=9)
    path = os.path.join(out, "step_600", "model.pt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    print(f"saving checkpoint to {path}", flush=True)
    torch.save({"model": model.state_dict(), "step": 600}, path)
    print(f"saved checkpoint to {path}", flush=True)
else:
    metrics = open(os.path.join(out, "metrics.jsonl"), "a")
    samples = open(os.path.join(out, "eval_samples.txt"), "a")
    for step in range(1310, 1400):
        loss = model(torch.randn(8, 256)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        step_line(step, seed=10)
        metrics.write(json.dumps({"step": step, "loss": round(loss.item(), 4)}) + "\n")
        metrics.flush()
        # decoded eval predictions, ~192 KiB a step
        samples.write("".join(f"step={step} sample={i} pred={'tok ' * 60}\n" for i in range(768)))
        samples.flush()
