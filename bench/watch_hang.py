"""The watch finds a hang by itself: hang -> recovery started, and what watching costs per target-hour (issue 50).

A real trainer (steps every 0.2 s, then blocks for good on a FIFO nobody writes: no CPU, no I/O, no GPU) is launched
HANGS times under `relaunch.flows.watch.Watch` in this process (a temporary Prefect server, as the tests' harness);
each time the seconds from the hang (the trainer's own marker file) to the watch's handover and to the recovery's end
are kept. Before that, a healthy stepping run is watched for QUIET_SECONDS to measure the cost: this process's CPU
(the watch's loop and its looks' ssh-free local commands: os.times, children included) and the recorder's on the host,
per watched target-hour. Prints JSON.

    .venv/bin/python bench/record.py watch_hang -- .venv/bin/python bench/watch_hang.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="relaunch-prefect-"))
os.environ.update(DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING")

from relaunch.config import Thresholds  # noqa: E402
from relaunch.flows.watch import Watch  # noqa: E402
from relaunch.tasks.launch import launch  # noqa: E402
from relaunch.tasks.stop import stop  # noqa: E402
from relaunch.testing.faults import reap, wait_for  # noqa: E402
from relaunch.testing.targets import shell_target  # noqa: E402

TRAINER = r"""
import os, time
once = os.environ["HANG_ONCE"]
for step in range(1, 1_000_000):
    print(f"step={step} loss=3.6441 | (20.0Ktok/s)", flush=True)
    time.sleep(0.2)
    if step == 10 and not os.path.exists(once):
        open(once, "w").close()
        open(os.environ["FIFO"]).read()  # blocks for good
"""


def ticks(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def recorder_seconds(t) -> float:
    run = Path(t.state_path) / "runs" / (Path(t.state_path) / "current").read_text().strip()
    try:
        return ticks(int((run / "recorder_pid").read_text().split()[0]))
    except (OSError, ValueError):
        return 0.0


def one_hang(t, once: Path, interval: float) -> dict[str, float]:
    """Launch, wait for the hang, watch until the watch handed it over and its recovery ended."""
    once.unlink(missing_ok=True)
    launch.fn(t, 1)
    wait_for(once.exists, 60, "the trainer to hang")
    hung_at = once.stat().st_mtime
    said: list[tuple[float, str]] = []
    watch = Watch([], lambda line: said.append((time.time(), line)), targets=[t])
    runner = threading.Thread(target=watch.run, args=(interval,), daemon=True)
    runner.start()
    try:
        wait_for(lambda: any("stands still" in line for _, line in said), 120, "the handover")
        wait_for(lambda: any("recovery ended" in line for _, line in said), 300, "the recovery")
    finally:
        watch.stopping.set()
        runner.join(timeout=120)
    handed = next(at for at, line in said if "stands still" in line) - hung_at
    ended = next(at for at, line in said if "recovery ended" in line) - hung_at
    return {"hang_to_handover_seconds": round(handed, 2), "hang_to_recovered_seconds": round(ended, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hangs", type=int, default=3)
    parser.add_argument("--floor", type=float, default=10.0, help="the stall window's floor, seconds")
    parser.add_argument("--interval", type=float, default=2.0, help="the watch's interval, seconds")
    parser.add_argument("--quiet-seconds", type=float, default=120.0, help="how long a healthy run is watched for the cost")
    args = parser.parse_args()
    from prefect.testing.utilities import prefect_test_harness

    work = Path(tempfile.mkdtemp(prefix="watch-hang-"))
    fifo, once = work / "fifo", work / "hung-once"
    os.mkfifo(fifo)
    thresholds = Thresholds(
        startup_grace_seconds=5, poll_interval_seconds=0.5, settle_timeout_seconds=120, stall_window_floor_seconds=args.floor
    )
    (work / "train.py").write_text(TRAINER)
    t = shell_target(
        work / "t",
        launch_command=f"{sys.executable} -u {work / 'train.py'}",
        env={"FIFO": str(fifo), "HANG_ONCE": str(once)},
        thresholds=thresholds,
    )
    rows = []
    cost = {}
    with prefect_test_harness(server_startup_timeout=120):
        try:
            # The cost: a healthy run (the hang already spent: the marker exists) watched for quiet_seconds.
            once.touch()
            launch.fn(t, 1)
            said: list[str] = []
            watch = Watch([], said.append, targets=[t])
            runner = threading.Thread(target=watch.run, args=(args.interval,), daemon=True)
            before, rec_before, wall = os.times(), recorder_seconds(t), time.monotonic()
            runner.start()
            time.sleep(args.quiet_seconds)
            watch.stopping.set()
            runner.join(timeout=120)
            after, rec_after, wall = os.times(), recorder_seconds(t), time.monotonic() - wall
            worker = (after.user + after.system + after.children_user + after.children_system) - (
                before.user + before.system + before.children_user + before.children_system
            )
            cost = {
                "watched_seconds": round(wall, 1),
                "worker_cpu_seconds_per_target_hour": round(worker / wall * 3600, 2),
                "host_recorder_cpu_seconds_per_target_hour": round((rec_after - rec_before) / wall * 3600, 2),
                "note": "the worker's figure includes the looks' local commands (this host is the target's); over SSH they run on the host",
            }
            stop.fn(t)
            for _ in range(args.hangs):
                rows.append(one_hang(t, once, args.interval))
                print(f"hang {len(rows)}: {rows[-1]}", file=sys.stderr)
                stop.fn(t)
        finally:
            reap(t)
    handover = [r["hang_to_handover_seconds"] for r in rows]
    print(
        json.dumps(
            {
                "floor_seconds": args.floor,
                "interval_seconds": args.interval,
                "sample_seconds": thresholds.progress_sample_seconds,
                "goal_seconds": args.floor + 5,
                "median_hang_to_handover_seconds": statistics.median(handover) if handover else None,
                "max_hang_to_handover_seconds": max(handover) if handover else None,
                "hangs": rows,
                "cost": cost,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
