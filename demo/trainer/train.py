"""Demo trainer: one thread per drafter, all calling compiled attention, step lines like the real run's.

Faults are real: a missing import, the FX race from a drifted tinyattn, a hang (DEMO_FAULT=hang), a loss that
goes nan after a learning-rate spike (--lr-jump-at).
"""

import argparse
import os
import queue
import threading
import time
from pathlib import Path

import tinyaccel  # the placement helper; a venv built from an incomplete lock lacks it
import torch
from model import TinyLM, loss_and_accuracy, synthetic_batch


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--drafters", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--checkpoint-dir", type=Path)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--resume", type=Path)
    # A learning-rate spike at this step (a bad schedule, as people launch by hand): the loss goes nan for real.
    p.add_argument("--lr-jump-at", type=int)
    p.add_argument("--lr-jump-factor", type=float, default=1e30)
    return p.parse_args()


def drafter(index: int, model: TinyLM, opt: torch.optim.Optimizer, args, stats: queue.Queue, errors: queue.Queue, go: threading.Event, hang: threading.Event) -> None:
    generator = torch.Generator().manual_seed(1000 + index)
    try:
        while go.is_set():
            if hang.is_set():
                threading.Event().wait()  # DEMO_FAULT=hang: alive, never progressing
            loss, acc = loss_and_accuracy(model, synthetic_batch(generator, args.batch, args.seq))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            stats.put((index, loss.item(), acc))
    except BaseException as exc:  # re-raised by the main thread, so the process dies with the traceback
        errors.put(exc)


def save_checkpoint(directory: Path, step: int, models: list, opts: list) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".step_{step}.pt.tmp"
    torch.save({"step": step, "models": [m.state_dict() for m in models], "opts": [o.state_dict() for o in opts]}, tmp)
    tmp.rename(directory / f"step_{step}.pt")


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(f"loading {args.drafters} drafters (batch={args.batch} seq={args.seq})", flush=True)
    models = [tinyaccel.place(TinyLM(), "cpu") for _ in range(args.drafters)]
    opts = [torch.optim.AdamW(m.parameters(), lr=args.lr) for m in models]
    step = 0
    if args.resume:
        state = torch.load(args.resume)
        for m, o, ms, os_ in zip(models, opts, state["models"], state["opts"]):
            m.load_state_dict(ms)
            o.load_state_dict(os_)
        step = state["step"]
        print(f"resumed from {args.resume} at step {step}", flush=True)
    stats, errors, go, hang = queue.Queue(), queue.Queue(), threading.Event(), threading.Event()
    go.set()
    threads = [threading.Thread(target=drafter, args=(i, m, o, args, stats, errors, go, hang), daemon=True, name=f"drafter-{i}") for i, (m, o) in enumerate(zip(models, opts))]
    for t in threads:
        t.start()
    hang_after = step + 5 if os.environ.get("DEMO_FAULT") == "hang" else None
    window, tick, pending = [], time.monotonic(), []
    while step < args.steps:
        try:
            pending.append(stats.get(timeout=0.5))
        except queue.Empty:
            pass
        if not errors.empty():
            raise errors.get()
        if len(pending) < args.drafters:
            continue
        batch, pending = pending[: args.drafters], pending[args.drafters :]
        step += 1
        now = time.monotonic()
        # Step 1 carries compilation or cache loading: keep it out of the running throughput.
        window = [now - tick] if step <= 2 else (window + [now - tick])[-10:]
        tick = now
        per_step = sum(window) / len(window)
        tokens = args.drafters * args.batch * args.seq / per_step
        loss = sum(b[1] for b in batch) / len(batch)
        acc = sum(b[2] for b in batch) / len(batch)
        print(f"step={step} loss={loss:.4f} acc={acc:.3f} lr={args.lr:.2e} | dft={1 / per_step:.2f}b/s ({tokens / 1000:.1f}Ktok/s) | q_hs={[stats.qsize()] * args.drafters}", flush=True)
        if args.lr_jump_at is not None and step == args.lr_jump_at:
            for o in opts:
                for group in o.param_groups:
                    group["lr"] *= args.lr_jump_factor
        if args.checkpoint_dir and step % args.checkpoint_every == 0:
            save_checkpoint(args.checkpoint_dir, step, models, opts)
        if hang_after is not None and step >= hang_after:
            print("waiting for the next batch", flush=True)
            hang.set()
    go.clear()
    print(f"training complete at step {step}", flush=True)


if __name__ == "__main__":
    main()
