"""Endless training-like loop; writes its pid to argv[1] so a test can signal it."""
import os
import sys
import time
from _steps import step_line

with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
step = int(sys.argv[2]) if len(sys.argv) > 2 else 100
while True:
    step_line(step, seed=step % 7)
    step += 1
    time.sleep(0.25)
