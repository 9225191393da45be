"""A trainer whose DataLoader worker grows until the kernel's OOM killer takes it (run inside a memory cgroup).

Usage: python -u dataloader_oom_trainer.py
The main process stays small; worker 0 holds ~40 MiB more per sample it produces (a leaking cache in __getitem__),
so the OOM killer picks the worker, and the main process learns of it from the DataLoader.
"""

import os

import torch
from torch.utils.data import DataLoader, Dataset

from _steps import step_line


class Leaky(Dataset):
    def __init__(self) -> None:
        self.held: list[bytes] = []

    def __len__(self) -> int:
        return 100000

    def __getitem__(self, i: int) -> torch.Tensor:
        self.held.append(b"\x01" * (40 << 20))  # written, so really resident
        return torch.full((16,), float(i))


print(f"trainer pid {os.getpid()}", flush=True)
loader = DataLoader(Leaky(), batch_size=1, num_workers=1, worker_init_fn=lambda w: print(f"worker {w} pid {os.getpid()}", flush=True))
for step, batch in enumerate(loader, start=4500):
    step_line(step, seed=45)
