"""The health poll on a big log: the first poll scans it whole, later polls only what was written since.

Launches a live trainer that writes nothing (`sleep`) through relaunch's own launch, fills its log with
step lines (real captured format) to --gb, then times relaunch's poll (`collect_snapshot`, the host
script run as the flow runs it): once on the whole log, then --polls times each after appending one
more MB. Prints one JSON line. The log is in the page cache (just written): this measures relaunch.

Usage: python bench/poll_big_log.py [--gb 1] [--polls 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from relaunch.tasks.health import collect_snapshot  # noqa: E402
from relaunch.tasks.launch import launch  # noqa: E402
from relaunch.tasks.stop import stop  # noqa: E402
from relaunch.testing.targets import current_log, shell_target  # noqa: E402

STEP = "step={} loss=3.6441 acc=0.097 lr=3.96e-04 | dft=0.50b/s (20.0Ktok/s) | q_hs=[2]\n"


def fill(path: Path, first: int, megabytes: float) -> int:
    """Append about `megabytes` of step lines; the next step number."""
    step, goal = first, path.stat().st_size + megabytes * (1 << 20)
    with open(path, "a") as f:
        while f.tell() < goal:
            f.write("".join(STEP.format(i) for i in range(step, step + 10_000)))
            step += 10_000
    return step


def timed_poll(target) -> float:
    start = time.monotonic()
    collect_snapshot(target)
    return round(time.monotonic() - start, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--polls", type=int, default=5)
    parser.add_argument("--dir", default="/tmp")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="relaunch-poll-") as work:
        target = shell_target(Path(work), name="bigpoll", launch_command="exec sleep 3600")
        launch.fn(target, 1)
        try:
            log = current_log(target)
            step = fill(log, 1, args.gb * 1024)
            size = log.stat().st_size
            first = timed_poll(target)
            later = []
            for _ in range(args.polls):
                step = fill(log, step, 1)
                later.append(timed_poll(target))
        finally:
            stop.fn(target)
    print(json.dumps({"log_bytes": size, "first_poll_seconds": first, "later_poll_seconds": later, "appended_per_poll_bytes": 1 << 20}))


if __name__ == "__main__":
    main()
