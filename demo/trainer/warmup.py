"""Compile every kernel once, single-threaded, forward and backward with gradients, before training starts."""

import argparse
import time

import torch
from model import TinyLM, loss_and_accuracy, synthetic_batch

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=64)
p.add_argument("--devices", default="cpu", help="comma-separated devices, warmed one at a time")
args = p.parse_args()

for device in args.devices.split(","):
    start = time.monotonic()
    model = TinyLM().to(device)
    with torch.enable_grad():
        loss, _ = loss_and_accuracy(model, synthetic_batch(torch.Generator().manual_seed(0), args.batch, args.seq).to(device))
        loss.backward()
    print(f"warmed {device} in {time.monotonic() - start:.1f} s", flush=True)
