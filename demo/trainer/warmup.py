"""Compile every kernel once, single-threaded, forward and backward with gradients, before training starts.

Each device is warmed in the shape training uses there (model.SHAPES), so the cached kernels are the ones
training looks up.
"""

import argparse
import time

import torch
from model import SHAPES, for_device, loss_and_accuracy, synthetic_batch

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, help="default: the device's shape in model.SHAPES")
p.add_argument("--seq", type=int, help="default: the device's shape in model.SHAPES")
p.add_argument("--devices", default="cpu", help="comma-separated devices, warmed one at a time")
args = p.parse_args()

for device in args.devices.split(","):
    start = time.monotonic()
    shape = SHAPES[torch.device(device).type]
    model = for_device(device)
    batch = synthetic_batch(torch.Generator().manual_seed(0), args.batch or shape.batch, args.seq or shape.seq).to(device)
    with torch.enable_grad():
        loss, _ = loss_and_accuracy(model, batch)
        loss.backward()
    print(f"warmed {device} in {time.monotonic() - start:.1f} s", flush=True)
