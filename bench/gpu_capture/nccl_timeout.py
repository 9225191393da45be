"""A real NCCL collective timeout (watchdog), two ranks on two GPUs under torchrun.

Both ranks train a few steps with gradient all_reduces; at --hang-step rank 1 sleeps --sleep
seconds (a stuck data loader) instead of entering the all_reduce that rank 0 has entered, so rank
0's NCCL watchdog times the collective out after --timeout seconds.
Usage: TORCH_NCCL_ASYNC_ERROR_HANDLING=1 torchrun --nproc-per-node 2 nccl_timeout.py --timeout 10 --sleep 60"""
import time

from _ddp import args, train

a = args(hang_step=3315, sleep=60.0)


def before_sync(rank, step):
    if rank == 1 and step == a.hang_step:
        time.sleep(a.sleep)


train(a, before_sync)
