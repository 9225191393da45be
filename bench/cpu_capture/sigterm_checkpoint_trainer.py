"""A trainer that saves a checkpoint when SIGTERM arrives (a scheduler's preemption notice), then dies of the signal.

Usage: python -u sigterm_checkpoint_trainer.py PIDFILE CKPT_DIR
Re-raising the signal with its default action after the save is how a well-behaved trainer reports a preemption:
its exit status still says SIGTERM (143), so nothing mistakes it for a run that finished.
"""

import os
import signal
import sys
import time

import torch

from _steps import step_line

pidfile, ckpt_dir = sys.argv[1], sys.argv[2]
model = torch.nn.Linear(64, 64)
step = 3300


def save_and_die(signum: int, frame: object) -> None:
    path = os.path.join(ckpt_dir, f"step_{step}.pt")
    print(f"received signal {signum} (SIGTERM): saving checkpoint step_{step}.pt before exiting", flush=True)
    torch.save({"model": model.state_dict(), "step": step}, path)
    print(f"saved checkpoint to {path}", flush=True)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


signal.signal(signal.SIGTERM, save_and_die)
with open(pidfile, "w") as f:
    f.write(str(os.getpid()))
while True:
    step_line(step, seed=33)
    step += 1
    time.sleep(0.25)
