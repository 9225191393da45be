"""Checkpoints that are intact but that this code or this torch cannot load.

Usage: python -u incompatible_checkpoint.py save PATH [--with-args]  train 6 steps, save {model, step} (with --with-args also
                                                                      the run's argparse.Namespace, as many trainers do)
       python -u incompatible_checkpoint.py resume PATH [--changed]   torch.load (weights_only default) as a resuming trainer
                                                                      does, into the model as it was, or (--changed) as the
                                                                      code now builds it: a renamed head, a wider embedding
"""

import argparse
import os
import sys

import torch

from _steps import step_line


class Net(torch.nn.Module):
    def __init__(self, width: int, head: str) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(256, width)
        setattr(self, head, torch.nn.Linear(width, 256))


mode, path, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
if mode == "save":
    os.makedirs(os.path.dirname(path), exist_ok=True)
    model = Net(256, "head")
    for step in range(795, 801):
        step_line(step, seed=21)
    state = {"model": model.state_dict(), "step": 800}
    if "--with-args" in flags:
        state["args"] = argparse.Namespace(lr=4e-4, batch_size=32, warmup_steps=200)
    torch.save(state, path)
    print(f"saved checkpoint to {path}", flush=True)
else:
    print(f"resuming from {path}", flush=True)
    ckpt = torch.load(path, map_location="cpu")  # torch >= 2.6: weights_only=True by default
    model = Net(384, "lm_head") if "--changed" in flags else Net(256, "head")
    model.load_state_dict(ckpt["model"])
    for step in range(ckpt["step"] + 1, ckpt["step"] + 6):
        step_line(step, seed=21)
