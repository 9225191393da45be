"""Demo trainer: one thread per drafter, all calling compiled attention, step lines like the real run's.

`--device cuda` puts drafter i on GPU i mod the GPU count, in the GPU shape (model.SHAPES), where attention is a
compiled flex_attention; the default is the CPU. Faults are real: a missing import, the FX race from a drifted
tinyattn, a hang (DEMO_FAULT=hang), a loss that goes nan after a learning-rate spike (--lr-jump-at).
"""

import argparse
import os
import queue
import threading
import time
from pathlib import Path

import tinyaccel  # the placement helper; a venv built from an incomplete lock lacks it
import torch
from model import SHAPES, TinyLM, for_device, loss_and_accuracy, synthetic_batch


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--drafters", type=int, default=2)
    p.add_argument("--device", choices=sorted(SHAPES), default="cpu")
    p.add_argument("--batch", type=int, help="default: the device's shape in model.SHAPES")
    p.add_argument("--seq", type=int, help="default: the device's shape in model.SHAPES")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--checkpoint-dir", type=Path)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--resume", type=Path)
    # A learning-rate spike at this step (a bad schedule, as people launch by hand): the loss goes nan for real.
    p.add_argument("--lr-jump-at", type=int)
    p.add_argument("--lr-jump-factor", type=float, default=1e30)
    args = p.parse_args()
    shape = SHAPES[args.device]
    args.batch = args.batch or shape.batch
    args.seq = args.seq or shape.seq
    return args


def drafter_devices(device: str, drafters: int) -> list[str]:
    """One device per drafter: the CPU for all, or the GPUs in turn (the incident's drafters had one each)."""
    if device == "cpu":
        return ["cpu"] * drafters
    return [f"cuda:{i % torch.cuda.device_count()}" for i in range(drafters)]


def process_age_seconds() -> float:
    """Seconds since this process started (its start time in /proc, against the uptime): imports included."""
    start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    return float(Path("/proc/uptime").read_text().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")


def drafter(index: int, model: TinyLM, opt: torch.optim.Optimizer, args, stats: queue.Queue, errors: queue.Queue, go: threading.Event, hang: threading.Event, turn: threading.Semaphore) -> None:
    generator = torch.Generator().manual_seed(1000 + index)
    device = next(model.parameters()).device
    try:
        while True:
            # One update per step line: a drafter that ran ahead of the logged steps (a GPU one does, while a
            # checkpoint is written) would leave step lines, learning-rate changes and checkpoints behind its weights.
            turn.acquire()
            if not go.is_set():
                return
            if hang.is_set():
                threading.Event().wait()  # DEMO_FAULT=hang: alive, never progressing
            loss, acc = loss_and_accuracy(model, synthetic_batch(generator, args.batch, args.seq).to(device))
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
    devices = drafter_devices(args.device, args.drafters)
    print(f"loading {args.drafters} drafters (batch={args.batch} seq={args.seq}) on {', '.join(devices)}", flush=True)
    models = [tinyaccel.place(for_device(d), d) for d in devices]
    opts = [torch.optim.AdamW(m.parameters(), lr=args.lr) for m in models]
    step = 0
    if args.resume:
        state = torch.load(args.resume, map_location=devices[0] if len(set(devices)) == 1 else "cpu")
        for m, o, ms, os_ in zip(models, opts, state["models"], state["opts"]):
            m.load_state_dict(ms)
            o.load_state_dict(os_)
        step = state["step"]
        print(f"resumed from {args.resume} at step {step}", flush=True)
    stats, errors, go, hang = queue.Queue(), queue.Queue(), threading.Event(), threading.Event()
    go.set()
    turns = [threading.Semaphore(1) for _ in models]
    threads = [threading.Thread(target=drafter, args=(i, m, o, args, stats, errors, go, hang, turns[i]), daemon=True, name=f"drafter-{i}") for i, (m, o) in enumerate(zip(models, opts))]
    for t in threads:
        t.start()
    hang_after = step + 5 if os.environ.get("DEMO_FAULT") == "hang" else None
    window, tick, pending = [], time.monotonic(), []
    started, first_step = tick, step + 1
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
        # The first step (after a resume too) carries compilation or cache loading: keep it out of the throughput.
        window = [now - tick] if step <= first_step + 1 else (window + [now - tick])[-10:]
        tick = now
        per_step = sum(window) / len(window)
        tokens = args.drafters * args.batch * args.seq / per_step
        loss = sum(b[1] for b in batch) / len(batch)
        acc = sum(b[2] for b in batch) / len(batch)
        if step == first_step:
            # What a warm compile cache saves: the first step carries the compilation or the cache load.
            print(f"first step in {now - started:.2f} s, {process_age_seconds():.2f} s after the process started", flush=True)
            if os.environ.get("DEMO_COMPILE_TIMES"):  # bench/warmup_efficacy.py: where the first step's time went
                print(torch._dynamo.utils.compile_times(), flush=True)
                counters = torch._dynamo.utils.counters
                print({k: dict(counters[k]) for k in ("inductor", "aot_autograd") if counters[k]}, flush=True)
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
        for turn in turns:
            turn.release()
    go.clear()
    for turn in turns:
        turn.release()
    print(f"training complete at step {step}", flush=True)


if __name__ == "__main__":
    main()
