"""A training loop that saves its evaluation features with numpy onto a disk that fills during the write (a small
tmpfs in the capture). numpy's tofile writes what it can and reports a short write, never ENOSPC by name.

Usage: python -u short_write_trainer.py DIR   6 steps, then np.save of a 100000-element float64 array to DIR/features.npy
"""

import os
import sys

import numpy as np

from _steps import step_line

out = sys.argv[1]
rng = np.random.default_rng(0)
weights = rng.standard_normal((64, 64))
for step in range(2995, 3001):
    weights -= 1e-3 * rng.standard_normal((64, 64))
    step_line(step, seed=48)
path = os.path.join(out, "features.npy")
print(f"saving eval features to {path}", flush=True)
np.save(path, rng.standard_normal(100000))
print(f"saved eval features to {path}", flush=True)
