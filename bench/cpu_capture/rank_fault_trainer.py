"""A data-parallel step loop on gloo (CPU) in which one rank goes wrong by itself after a few steps.

Under torchrun (env:// from its variables) or alone with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by hand.
Usage: python -u rank_fault_trainer.py FAULT [--bad-rank N] [--at-step N]
  index:    the bad rank looks a token id past its vocabulary up in its embedding (IndexError in F.embedding)
  mismatch: from that step on the bad rank also trains an auxiliary head (a config only it read), so its flattened
            gradient, all_reduced as one tensor, is larger than the others'
  segv:     the bad rank's native code reads address 0 (a custom op gone wrong): a real SIGSEGV, nothing printed
Only rank 0 prints step lines (as trainers do); every rank prints its start line.
"""

import argparse
import ctypes
import os
import time

import torch
import torch.distributed as dist

from _steps import step_line

p = argparse.ArgumentParser()
p.add_argument("fault", choices=["index", "mismatch", "segv"])
p.add_argument("--bad-rank", type=int, default=1)
p.add_argument("--at-step", type=int, default=4)
a = p.parse_args()
rank = int(os.environ["RANK"])
print(f"rank {rank} (pid {os.getpid()}): init_process_group gloo", flush=True)
dist.init_process_group("gloo")
bad = rank == a.bad_rank
vocab, width = 1000, 64
embed = torch.nn.Embedding(vocab, width)
head = torch.nn.Linear(width, 10)
aux = torch.nn.Linear(width, 1)  # the auxiliary head only the bad rank turns on (mismatch)
params = [*embed.parameters(), *head.parameters()]
for i, step in enumerate(range(4800, 4800 + 100000)):
    tokens = torch.randint(0, vocab, (8, 32))
    if bad and a.fault == "index" and i == a.at_step:
        tokens[0, 0] = vocab + 7  # a token id the tokenizer should never have produced
    if bad and a.fault == "mismatch" and i == a.at_step:
        params += list(aux.parameters())
    if bad and a.fault == "segv" and i == a.at_step:
        ctypes.string_at(0)  # strlen() on NULL
    h = embed(tokens)
    loss = head(h).pow(2).mean() + (aux(h).mean() if len(params) > 4 else 0)
    loss.backward()
    flat = torch.cat([q.grad.flatten() for q in params]) if a.fault == "mismatch" else params[0].grad.flatten()
    dist.all_reduce(flat)  # gloo: the ranks' gradients meet here
    for q in params:
        q.grad = None
    if rank == 0:
        step_line(step, seed=35)
    time.sleep(0.2)
