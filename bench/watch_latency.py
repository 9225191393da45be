"""How soon `relaunch watch` hands a death over, and how soon the run is healthy again.

A real trainer (the suite's stepper in tmux, through relaunch's own launch) is watched by flows/watch.Watch at
--interval-seconds, in its own thread, against a temporary Prefect server; it is SIGKILLed --kills times. For each
kill: seconds from the SIGKILL to the recovery handed over (the watch's "died" line), and to the recovery's report
(healthy again), and one look's cost. Prints one JSON line with every kill and the median and max.

Usage: python bench/watch_latency.py [--kills 5] [--interval-seconds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--interval-seconds", type=float, default=2.0)
    args = parser.parse_args()
    os.environ.setdefault("DO_NOT_TRACK", "1")
    from prefect.testing.utilities import prefect_test_harness

    from relaunch.flows.watch import Watch, look
    from relaunch.tasks.launch import launch
    from relaunch.testing.targets import current, shell_target, stop_all

    work = Path(tempfile.mkdtemp(prefix="relaunch-watch-bench-"))
    target = shell_target(work, name="watch-bench")
    source = work / "target.yaml"
    source.write_text(yaml.safe_dump(target.model_dump(mode="json")))
    died = threading.Event()
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        if "died" in line:
            died.set()

    kills = []
    with prefect_test_harness(server_startup_timeout=60):
        launch.fn(target, 1)
        watch = Watch([source], say)
        runner = threading.Thread(target=watch.run, args=(args.interval_seconds,), daemon=True)
        runner.start()
        try:
            for _ in range(args.kills):
                time.sleep(args.interval_seconds * 1.5)  # the run as the watch last saw it: running
                run_id = current(target)
                pid = int(Path(target.state_path, "runs", run_id, "pid").read_text().split()[0])
                died.clear()
                t0 = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                died.wait(120)
                handed = time.monotonic() - t0
                while watch.watched[target.name].recovery is not None or current(target) == run_id:
                    time.sleep(0.05)
                kills.append({"handed_over_seconds": round(handed, 2), "healthy_seconds": round(time.monotonic() - t0, 2)})
            t = time.monotonic()
            look(target)
            look_ms = round((time.monotonic() - t) * 1000, 1)
        finally:
            watch.stopping.set()
            runner.join(600)
            stop_all(target)
    handed = [k["handed_over_seconds"] for k in kills]
    healthy = [k["healthy_seconds"] for k in kills]
    print(
        json.dumps(
            {
                "interval_seconds": args.interval_seconds,
                "kills": kills,
                "handed_over_median_s": statistics.median(handed),
                "handed_over_max_s": max(handed),
                "healthy_median_s": statistics.median(healthy),
                "healthy_max_s": max(healthy),
                "one_look_ms": look_ms,
            }
        )
    )


if __name__ == "__main__":
    main()
