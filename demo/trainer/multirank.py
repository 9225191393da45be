"""Multi-rank demo trainer: data-parallel under torchrun, one process per rank, step lines like the real run's.

    torchrun --standalone --nproc-per-node N multirank.py --checkpoint-dir DIR [--resume DIR/step_N.pt]

Each rank trains the same small language model on its own synthetic batches; the gradients are
all_reduced every step (gloo on the CPU; nccl with `--device cuda`, one GPU per local rank). Only rank 0
prints step lines and writes `step_N.pt` every `--checkpoint-every` steps (written aside, then renamed).

Faults, for tests, each real:
- a hung rank: `--hang-rank R --hang-after M` (or DEMO_HANG_RANK / DEMO_HANG_AFTER): after step M, rank R
  stops inside `fetch_batch` (sleeping forever, alive) while every other rank waits for it inside the
  gradient all_reduce. With `--hang-marker PATH` (DEMO_HANG_MARKER) it hangs only where PATH does not exist
  yet, and creates it: the hang happens on the first launch only, as a rare stuck loader does.
  `--hang-local-rank L` (DEMO_HANG_LOCAL_RANK) picks the rank by its local rank instead: set in one node's
  environment only, it hangs a rank of that node whatever global rank the rendezvous gave it.
  The process group's timeout (`--pg-timeout`, 30 min by default) is long, so the waiting ranks stay in the
  collective rather than being failed by the backend's own timeout.
- a dead rank: nothing here; the test kills a rank's process for real (SIGKILL), and torchrun ends the rest.
"""

import argparse
import datetime
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM = 256, 64


def parse_args() -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    # gloo on CUDA tensors where ranks share a GPU (NCCL refuses two ranks on one device: bench/gpu_gang).
    p.add_argument("--backend", choices=["nccl", "gloo"], help="default: nccl with --device cuda, gloo on the CPU")
    p.add_argument("--pg-timeout", type=float, default=1800.0, help="process-group timeout, seconds")
    p.add_argument("--step-seconds", type=float, default=0.05, help="pause after each step (paces the demo)")
    p.add_argument("--checkpoint-dir", type=Path)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--resume", type=Path)
    p.add_argument("--hang-rank", type=int, default=int(env("DEMO_HANG_RANK", "-1")))
    p.add_argument("--hang-local-rank", type=int, default=int(env("DEMO_HANG_LOCAL_RANK", "-1")))
    p.add_argument("--hang-after", type=int, default=int(env("DEMO_HANG_AFTER", "-1")))
    p.add_argument("--hang-marker", type=Path, default=Path(env("DEMO_HANG_MARKER")) if env("DEMO_HANG_MARKER") else None)
    return p.parse_args()


class TinyLM(nn.Module):
    """Next-token prediction from the previous token and a running mean of the context: small and fast."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Sequential(nn.Linear(2 * DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        context = x.cumsum(1) / torch.arange(1, x.shape[1] + 1, device=x.device).view(1, -1, 1)
        return self.head(x + self.mix(torch.cat([x, context], dim=-1)))


def synthetic_batch(generator: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    """Tokens with structure to learn: each sequence counts up from a random start, with noise."""
    start = torch.randint(0, VOCAB, (batch, 1), generator=generator)
    tokens = (start + torch.arange(seq + 1)) % VOCAB
    noise = torch.randint(0, VOCAB, tokens.shape, generator=generator)
    keep = torch.rand(tokens.shape, generator=generator) < 0.9
    return torch.where(keep, tokens, noise)


def hangs_now(args: argparse.Namespace, rank: int, step: int) -> bool:
    chosen = rank == args.hang_rank or int(os.environ.get("LOCAL_RANK", "-1")) == args.hang_local_rank >= 0
    if not chosen or args.hang_after < 0 or step <= args.hang_after:
        return False
    if args.hang_marker is None:
        return True
    try:
        args.hang_marker.touch(exist_ok=False)  # first launch only
    except FileExistsError:
        return False
    return True


def fetch_batch(generator: torch.Generator, args: argparse.Namespace, rank: int, step: int, device: torch.device) -> torch.Tensor:
    if hangs_now(args, rank, step):
        print(f"[rank {rank}] waiting for the next batch", flush=True)
        while True:  # a stuck data source: alive, never returning
            time.sleep(3600)
    return synthetic_batch(generator, args.batch, args.seq).to(device)


def all_reduce_grads(model: nn.Module, world: int) -> None:
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)  # every rank waits here for the slowest one
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def save_checkpoint(directory: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".step_{step}.pt.tmp"
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    tmp.rename(directory / f"step_{step}.pt")


def train(args: argparse.Namespace) -> None:
    rank, local, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = args.device == "cuda"
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = args.backend or ("nccl" if cuda else "gloo")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.pg_timeout))
    print(f"[rank {rank}] process group ready: backend={backend} world={world} device={device} pid={os.getpid()}", flush=True)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = TinyLM().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step = 0
    if args.resume:
        state = torch.load(args.resume, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        if rank == 0:
            print(f"resumed from {args.resume} at step {step}", flush=True)
    generator = torch.Generator().manual_seed(1000 * rank + step)
    tokens_per_step = world * args.batch * args.seq
    window, tick = [], time.monotonic()
    while step < args.steps:
        batch = fetch_batch(generator, args, rank, step, device)
        logits = model(batch[:, :-1])
        target = batch[:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        all_reduce_grads(model, world)
        opt.step()
        stats = torch.stack([loss.detach(), (logits.argmax(-1) == target).float().mean()])
        dist.all_reduce(stats)
        loss_value, acc = (stats / world).tolist()
        step += 1
        if rank == 0:
            now = time.monotonic()
            # The first step carries start-up: keep it out of the running throughput.
            window = [now - tick] if step <= 2 else (window + [now - tick])[-10:]
            tick = now
            per_step = sum(window) / len(window)
            lr = opt.param_groups[0]["lr"]
            print(
                f"step={step} loss={loss_value:.4f} acc={acc:.3f} lr={lr:.2e} | dft={1 / per_step:.2f}b/s ({tokens_per_step / per_step / 1000:.1f}Ktok/s) | q_hs=[{world}]",
                flush=True,
            )
            if args.checkpoint_dir and step % args.checkpoint_every == 0:
                save_checkpoint(args.checkpoint_dir, step, model, opt)
        if args.step_seconds:
            time.sleep(args.step_seconds)
    if rank == 0:
        print(f"training complete at step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    train(parse_args())
