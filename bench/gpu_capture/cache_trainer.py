"""A tiny trainer whose forward and backward run through torch.compile, for the compile-cache captures.

Its kernels come from the inductor cache (TORCHINDUCTOR_CACHE_DIR) and, on CUDA, from Triton's cache beneath it,
so bench/gpu_capture/capture_cache.sh can warm one cache, damage copies of it and watch a fresh process start on each.
Prints when the first compiled step finished (a warm cache makes it seconds, a recompile tens of seconds), then
step lines in the shape of _steps.step_line. Usage: python -u cache_trainer.py [--device cuda|cpu] [--steps N]
"""

import argparse
import os
import time

import torch
from _steps import step_line

# Rows per step stand in for tokens; the CPU shape only has to exercise the same code path quickly.
SHAPES = {"cuda": (16384, 1024, 4), "cpu": (256, 128, 2)}


def mlp(dim: int, layers: int) -> torch.nn.Module:
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.LayerNorm(dim), torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)]
    return torch.nn.Sequential(*blocks)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    rows, dim, layers = SHAPES[args.device]
    print(
        f"cache_trainer device={args.device} torch={torch.__version__} "
        f"TORCHINDUCTOR_CACHE_DIR={os.environ.get('TORCHINDUCTOR_CACHE_DIR')} "
        f"TRITON_CACHE_DIR={os.environ.get('TRITON_CACHE_DIR')}",
        flush=True,
    )
    torch.manual_seed(0)
    model = mlp(dim, layers).to(args.device)
    target = mlp(dim, layers).to(args.device).requires_grad_(False)  # a fixed random teacher: the loss falls
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step_fn = torch.compile(lambda x: torch.nn.functional.mse_loss(model(x), target(x)))
    t_start = time.perf_counter()
    for i in range(args.steps):
        t0 = time.perf_counter()
        x = torch.randn(rows, dim, device=args.device)
        loss = step_fn(x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()  # synchronises, so the wall time below includes the GPU's work
        elapsed = time.perf_counter() - t0
        if i == 0:
            print(f"first compiled step in {time.perf_counter() - t_start:.2f} s", flush=True)
        step_line(4100 + i, value, rows / elapsed, seed=26)
    print(f"cache_trainer done: {args.steps} steps", flush=True)


if __name__ == "__main__":
    main()
