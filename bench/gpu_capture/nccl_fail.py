"""Two NCCL ranks on one GPU (cuda:0), spawned with torch.multiprocessing.

Expected: NCCL refuses two ranks on the same device at the first collective.
If NCCL accepts it, fall through to a collective timeout: rank 1 sleeps while
rank 0 all_reduces with a 20 s process-group timeout (watchdog).
--knock-on: catch the collective's failure and go on to a local step that
allocates far more than the GPU has (CUDA OOM raised while handling it)."""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from _steps import step_line


def run(rank, world, knock_on):
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
    w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    for step in range(3310, 3313):
        t0 = time.perf_counter()
        x = torch.randn(8192, 1024, device="cuda")
        loss = (x @ w).tanh().pow(2).mean()
        loss.backward()
        torch.cuda.synchronize()
        if rank == 0:
            step_line(step, loss.item(), 8192 / (time.perf_counter() - t0), seed=11)
    try:
        dist.all_reduce(w.grad)  # gradient sync
        torch.cuda.synchronize()
    except Exception as e:
        if not knock_on:
            raise
        print(f"[rank{rank}] gradient all_reduce failed ({type(e).__name__}); continuing with local step", flush=True)
        big = torch.empty(200 * 2**30, dtype=torch.uint8, device="cuda")
        big.zero_()
    # the first collective worked: make a collective time out
    if rank == 1:
        time.sleep(90)
    else:
        dist.all_reduce(w.grad)
        torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--knock-on", action="store_true")
    p.add_argument("--port", default="29512")
    a = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = a.port
    mp.spawn(run, args=(2, a.knock_on), nprocs=2, join=True)
