"""Detection latency: from the demo trainer's death to a `crashed` verdict, polling as the flow does.

Kills the demo trainer at random moments, many times, and prints the figures as JSON.
Two ways to die: the trainer alone is SIGKILLed (the supervisor records exit code 137), or its
whole process group and tmux session go at once (no exit code: `silent_exit` from the PID check).

Usage: .venv/bin/python bench/detection_latency.py [--trials 20] [--workdir DIR]
Median, p95 and max come from bench/stats.py (p95: nearest rank, the value at ceil(0.95*n) of n sorted;
for fewer than 20 trials per mode that is the maximum).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"

from bench.stats import P95_METHOD, machine, summary  # noqa: E402
from relaunch.demo.scenarios import prepare  # noqa: E402
from relaunch.judging.diagnosis import advance, diagnose  # noqa: E402
from relaunch.judging.findings import Progress  # noqa: E402
from relaunch.tasks.health import collect_snapshot  # noqa: E402
from relaunch.tasks.launch import launch  # noqa: E402
from relaunch.tasks.rebuild_venv import rebuild_venv  # noqa: E402
from relaunch.tasks.stop import stop  # noqa: E402
from relaunch.tasks.warm_cache import warm_cache  # noqa: E402
from relaunch.vocabulary import Verdict  # noqa: E402


def trial(target, mode: str, rng: random.Random) -> dict:
    record, _ = launch.fn(target, 1)
    state = Path(target.state_path) / "runs" / record.run_id
    detected: dict = {}
    ready = threading.Event()

    def poll() -> None:
        progress, polls = Progress(), 0
        while True:
            snap = collect_snapshot(target, wait_seconds=target.thresholds.poll_interval_seconds)
            polls += 1
            ready.set()
            progress = advance(progress, snap, target.thresholds)
            d = diagnose(snap, target.thresholds, progress)
            if d.verdict is Verdict.CRASHED:
                detected.update(at=time.monotonic(), polls=polls, cause=d.cause.value)
                return

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    ready.wait()
    time.sleep(rng.uniform(0.5, 6.0))  # a random moment: start-up, compile or steady stepping
    killed_at = time.monotonic()
    if mode == "trainer":
        os.kill(record.pid, signal.SIGKILL)
    else:
        os.killpg(int((state / "supervisor_pid").read_text().split()[0]), signal.SIGKILL)
        subprocess.run(["tmux", "kill-session", "-t", f"={target.tmux_session}"], check=False)
    poller.join(timeout=60)
    stop.fn(target)
    return {"mode": mode, "latency_seconds": round(detected["at"] - killed_at, 4), "cause": detected["cause"], "polls": detected["polls"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=20, help="per death mode")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/relaunch-bench-latency"))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    target = prepare("healthy", args.workdir)
    target = target.model_copy(update={"thresholds": target.thresholds.model_copy(update={"poll_interval_seconds": 5.0})})
    rebuild_venv.fn(target)
    warm_cache.fn(target)
    rng = random.Random(args.seed)
    started = machine()
    results = [trial(target, mode, rng) for _ in range(args.trials) for mode in ("trainer", "group")]
    by_mode = {m: summary([r["latency_seconds"] for r in results if r["mode"] == m], unit="seconds") for m in ("trainer", "group")}
    print(
        json.dumps(
            {
                "what": "seconds from SIGKILL of the demo trainer to a crashed verdict; one round trip per poll, poll_interval_seconds=5",
                "host": "local",
                "machine": started,
                "trials_per_mode": args.trials,
                "seed": args.seed,
                "p95_method": P95_METHOD,
                "overall": summary([r["latency_seconds"] for r in results], unit="seconds"),
                "by_mode": by_mode,
                "causes": sorted({r["cause"] for r in results}),
                "trials": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
