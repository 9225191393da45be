"""Training loop whose dataset returns a sample without the key the collate step needs."""
import torch
from torch.utils.data import DataLoader, Dataset
from _steps import step_line


class Shards(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        sample = {"input_ids": torch.arange(16) + i, "labels": torch.arange(16)}
        if i == 37:  # a corrupt record in the shard
            del sample["labels"]
        return sample


def collate(batch):
    return {k: torch.stack([b[k] for b in batch]) for k in ("input_ids", "labels")}


step = 2040
for batch in DataLoader(Shards(), batch_size=8, collate_fn=collate):
    step_line(step, seed=3)
    step += 1
