"""Checkpoint save killed mid-write, then a resume from the truncated file.

Usage: python -u truncated_checkpoint.py save PATH   torch.save ~300 MiB to PATH (killed from outside)
       python -u truncated_checkpoint.py resume PATH torch.load PATH as a resuming trainer would
"""
import os
import sys

import torch

from _steps import step_line

mode, path = sys.argv[1], sys.argv[2]
if mode == "save":
    os.makedirs(os.path.dirname(path), exist_ok=True)
    state = {f"blocks.{i}.weight": torch.randn(1024, 1024 * 3) for i in range(25)}  # 25 x 12 MiB
    for step in range(595, 601):
        step_line(step, seed=13)
    print(f"saving checkpoint to {path}", flush=True)
    torch.save({"model": state, "step": 600}, path)
    print(f"saved checkpoint to {path}", flush=True)
else:
    print(f"resuming from {path}", flush=True)
    ckpt = torch.load(path, map_location="cpu")
    step = ckpt["step"] + 1
    for step in range(step, step + 5):
        step_line(step, seed=13)
