"""A torch step loop a person stops with Ctrl-C (SIGINT); writes its pid to argv[1] so a driver can signal it.

Usage: python -u interrupt_trainer.py PIDFILE [WORKERS]
  WORKERS: DataLoader worker processes (0: batches made in the main process). A terminal's Ctrl-C reaches the
  whole foreground process group, the workers included.
"""

import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset

from _steps import step_line


class Tokens(Dataset):
    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        return torch.randint(0, 1000, (32,))


workers = int(sys.argv[2]) if len(sys.argv) > 2 else 0
model = torch.nn.Sequential(torch.nn.Embedding(1000, 64), torch.nn.Linear(64, 1000))
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
for step, batch in enumerate(DataLoader(Tokens(), batch_size=16, num_workers=workers), start=6100):
    logits = model(batch)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
    step_line(step, seed=35)
    torch.manual_seed(step)
    for _ in range(20):  # more work per step, as a real model has
        model(batch).sum().backward()
    opt.zero_grad()
