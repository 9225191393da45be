"""Ranks on gloo (CPU) that meet at a monitored barrier after each epoch; a rank that is late (its shard takes long to
load) never arrives within the barrier's timeout, and rank 0 reports which rank did not pass it.

Usage: python -u barrier_trainer.py [--late RANK ...] [--timeout-s N] [--wait-all-ranks] [--late-s N]
Under torchrun (env:// from its variables) or alone with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by hand. Each rank
trains 4 steps (rank 0 prints step lines), then every rank named by --late sleeps --late-s seconds before the barrier.
"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist

from _steps import step_line

p = argparse.ArgumentParser()
p.add_argument("--late", type=int, nargs="*", default=[1])
p.add_argument("--timeout-s", type=float, default=30)
p.add_argument("--late-s", type=float, default=60)
p.add_argument("--wait-all-ranks", action="store_true")
a = p.parse_args()
rank = int(os.environ["RANK"])
print(f"rank {rank} (pid {os.getpid()}): init_process_group gloo", flush=True)
dist.init_process_group("gloo")
grad = torch.ones(1 << 16)
for step in range(5200, 5204):
    dist.all_reduce(grad)
    grad.fill_(1.0)
    if rank == 0:
        step_line(step, seed=48)
    time.sleep(0.1)
if rank in a.late:
    time.sleep(a.late_s)  # loading the next epoch's shard, slowly
dist.monitored_barrier(timeout=datetime.timedelta(seconds=a.timeout_s), wait_all_ranks=a.wait_all_ranks)
if rank == 0:
    print("epoch 1 done", flush=True)
dist.destroy_process_group()
