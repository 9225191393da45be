"""Shared by nccl_timeout.py and rank_killed.py: a data-parallel step loop under torchrun.

Each rank computes a local loss on its own GPU, all_reduces the gradient (backend nccl), and
rank 0 prints incident-style step lines. `before_sync(step)` runs on every rank just before the
step's all_reduce, so a script can make one rank stop taking part."""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist

from _steps import step_line


def args(**extra):
    p = argparse.ArgumentParser()
    p.add_argument("--timeout", type=float, default=600.0, help="process-group timeout, seconds")
    p.add_argument("--first-step", type=int, default=3310)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--backend", default="nccl")
    for name, default in extra.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    return p.parse_args()


def train(a, before_sync):
    rank, local, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = a.backend == "nccl"
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group(a.backend, timeout=datetime.timedelta(seconds=a.timeout))
    print(f"[rank {rank}] process group ready: backend={a.backend} world={world} device={dev} timeout={a.timeout:.0f}s", flush=True)
    torch.manual_seed(rank)
    w = torch.randn(1024, 1024, device=dev, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-3)
    for step in range(a.first_step, a.first_step + a.steps):
        t0 = time.perf_counter()
        x = torch.randn(8192, 1024, device=dev)
        loss = (x @ w).tanh().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        before_sync(rank, step)
        dist.all_reduce(w.grad)  # gradient sync
        w.grad /= world
        opt.step()
        loss = loss.detach()
        dist.all_reduce(loss)
        if cuda:
            torch.cuda.synchronize()
        if rank == 0:
            step_line(step, loss.item() / world, world * 8192 / (time.perf_counter() - t0), seed=13)
    dist.destroy_process_group()
