"""A data-parallel step loop on gloo (CPU): every step all_reduces a gradient-sized tensor across the ranks.

Under torchrun (env:// from its variables) or alone with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by hand.
Usage: python -u dist_trainer.py [--pid-dir DIR] [--init-timeout-s N] [--steps N]
  --pid-dir: each rank writes its pid to DIR/rank{RANK}.attempt{TORCHELASTIC_RESTART_COUNT}, so a driver can kill one.
Only rank 0 prints step lines (as trainers do); every rank prints its start line.
"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist

from _steps import step_line

p = argparse.ArgumentParser()
p.add_argument("--pid-dir")
p.add_argument("--init-timeout-s", type=float, default=1800)
p.add_argument("--steps", type=int, default=100000)
a = p.parse_args()
rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
print(f"rank {rank} (attempt {attempt}, pid {os.getpid()}): init_process_group gloo", flush=True)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.init_timeout_s))
if a.pid_dir:
    with open(os.path.join(a.pid_dir, f"rank{rank}.attempt{attempt}"), "w") as f:
        f.write(str(os.getpid()))
grad = torch.ones(1 << 20)
for step in range(2100, 2100 + a.steps):
    dist.all_reduce(grad)  # gloo: a lost peer surfaces here
    grad.fill_(1.0)
    if rank == 0:
        step_line(step, seed=26)
    time.sleep(0.2)
dist.destroy_process_group()
