"""One rank killed by SIGKILL mid-training while the other waits in a collective, under torchrun.

At --kill-step rank 1 sends itself SIGKILL (as the kernel's OOM killer or an operator would) just
before the gradient all_reduce that rank 0 has already entered; torchrun sees the dead rank and
ends the job. Usage: torchrun --nproc-per-node 2 rank_killed.py"""
import os
import signal

from _ddp import args, train

a = args(kill_step=3315)


def before_sync(rank, step):
    if rank == 1 and step == a.kill_step:
        os.kill(os.getpid(), signal.SIGKILL)


train(a, before_sync)
