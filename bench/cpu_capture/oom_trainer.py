"""Training-like loop that leaks ~50 MB per step until the cgroup OOM killer fires."""
import sys
import time
from _steps import step_line

held = []
start = int(sys.argv[1]) if len(sys.argv) > 1 else 577
for step in range(start, start + 100000):
    step_line(step, seed=1)
    held.append(b"\x01" * (50 * 1024 * 1024))  # written, so really resident
    time.sleep(0.05)
