"""A training loop that streams its data from shard files, N steps a shard; a shard that is not there ends it with an
uncaught FileNotFoundError (the shard list was written before a clean-up removed one). Nothing here raises by hand.

Usage: python -u shard_trainer.py DATA_DIR [STEPS_PER_SHARD]
Under torchrun (RANK, WORLD_SIZE set) rank r reads DATA_DIR/rank{r}/ and only rank 0 prints step lines; a rank whose
shards are all there keeps training (slowly) until torchrun stops it.
"""

import os
import sys
import time

import torch

from _steps import step_line

data_dir = sys.argv[1]
per_shard = int(sys.argv[2]) if len(sys.argv) > 2 else 3
rank = int(os.environ.get("RANK", "0"))
if "WORLD_SIZE" in os.environ:
    data_dir = os.path.join(data_dir, f"rank{rank}")
torch.manual_seed(rank)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
# The shard list as the data preparation wrote it, not what is on disk now.
shards = [os.path.join(data_dir, f"shard_{i:05d}.bin") for i in range(64)]
step = 4100
for shard in shards:
    with open(shard, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).view(-1, 64)
    for i in range(per_shard):
        loss = model(data[i % len(data) : i % len(data) + 8]).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0:
            step_line(step, seed=48)
        step += 1
        time.sleep(0.05 if rank == 0 else 0.5)
