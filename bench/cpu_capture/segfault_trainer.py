"""Training loop that crashes the interpreter with a real SIGSEGV (a native read of address 0).

Stands in for a bad pointer in a C extension / custom op: `ctypes.string_at(0)` dereferences NULL.
Usage: python -u segfault_trainer.py [segv|abort]   (abort: os.abort(), a real SIGABRT)
"""
import ctypes
import os
import sys

import torch

from _steps import step_line

how = sys.argv[1] if len(sys.argv) > 1 else "segv"
model = torch.nn.Linear(64, 10)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
start = 3180 if how == "segv" else 2260
for step in range(start, start + 5):
    model(torch.randn(8, 64)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    step_line(step, seed=11)


def fused_update(ptr):  # the "extension" call that goes wrong
    return ctypes.string_at(ptr)  # strlen() on the pointer: reads it


if how == "segv":
    fused_update(0)
else:
    os.abort()
