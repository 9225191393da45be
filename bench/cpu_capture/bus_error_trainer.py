"""Training loop whose DataLoader workers (num_workers=2) pass 4 MiB tensors through shared memory.

Run with a tiny /dev/shm (1 MiB tmpfs in a private mount namespace) so the workers' shared memory
cannot be had. Usage: python -u bus_error_trainer.py [MIB_PER_SAMPLE]
"""
import sys

import torch
from torch.utils.data import DataLoader, Dataset

from _steps import step_line

mib = int(sys.argv[1]) if len(sys.argv) > 1 else 4


class Frames(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(mib * 1024 * 1024 // 4, generator=g)  # fp32: MIB_PER_SAMPLE MiB


model = torch.nn.Linear(1024, 16)
torch.manual_seed(0)
# A few warm-up steps on synthetic batches, then the real data loader starts.
for step in range(880, 884):
    model(torch.randn(8, 1024)).pow(2).mean().backward()
    step_line(step, seed=12)
step = 884
for batch in DataLoader(Frames(), batch_size=1, num_workers=2):
    model(batch.view(-1, 1024)[:8]).pow(2).mean().backward()
    step_line(step, seed=12)
    step += 1
