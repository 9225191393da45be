"""What the progress record costs the host: the recorder (relaunch/host/recorder.sh) beside a real tree of processes.

A trainer-like tree (a Python process with CHILDREN sleeping children and a thread, as a DataLoader's workers are) is
recorded for SECONDS at each interval; the recorder's own CPU (its ticks, and its reaped children's: the grep for
marked processes, nvidia-smi where present) is read from /proc at its end. Printed as JSON: CPU milliseconds per
sample and CPU seconds per hour of recording at each interval, the default's (Thresholds().progress_sample_seconds)
first. The issue's budget: the watch's whole cost per watched target-hour was ~4 CPU s on the host before the record,
and must stay under twice that.

    .venv/bin/python bench/record.py recorder_cost -- .venv/bin/python bench/recorder_cost.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from relaunch.config import Thresholds  # noqa: E402
from relaunch.host import _shared  # noqa: E402

TREE = r"""
import subprocess, sys, threading, time
kids = [subprocess.Popen(["sleep", "3600"]) for _ in range(int(sys.argv[1]))]
threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
print("ready", flush=True)
time.sleep(3600)
"""


def ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15])


def measure(seconds: float, every: float, children: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        run = state / "runs" / "r1"
        run.mkdir(parents=True)
        (state / "current").write_text("r1\n")
        (Path(tmp) / "log").write_text("step=1\n")
        (run / "log_path").write_text(f"{tmp}/log\n")
        tree = subprocess.Popen([sys.executable, "-c", TREE, str(children)], stdout=subprocess.PIPE, text=True)
        try:
            assert tree.stdout is not None and tree.stdout.readline().strip() == "ready"
            start = Path(f"/proc/{tree.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
            (run / "pid").write_text(f"{tree.pid} {start}\n")
            script = Path(tmp) / "start.sh"
            script.write_text(f'{_shared("lib")}\n{_shared("recorder")}\nstart_recorder "$1" "$2"\n')
            subprocess.run(["bash", str(script), str(run), f"{every:g}"], check=True)
            deadline = time.monotonic() + 10
            while not (run / "recorder_pid").exists():
                assert time.monotonic() < deadline, "no recorder started"
                time.sleep(0.05)
            recorder = int((run / "recorder_pid").read_text().split()[0])
            time.sleep(seconds)
            used = ticks(recorder) / os.sysconf("SC_CLK_TCK")
            samples = sum(1 for line in (run / "progress").read_text().splitlines() if line.startswith("@ "))
        finally:
            tree.kill()
            tree.wait()
        deadline = time.monotonic() + 10 + 3 * every
        while Path(f"/proc/{recorder}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    return {
        "interval_seconds": every,
        "samples": samples,
        "processes_per_sample": children + 1,
        "cpu_seconds": round(used, 3),
        "cpu_ms_per_sample": round(1000 * used / max(samples, 1), 2),
        "cpu_seconds_per_hour": round(used / max(samples, 1) * 3600 / every, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="How long each interval is recorded.")
    parser.add_argument("--children", type=int, default=8, help="Sleeping children of the tree (a DataLoader's workers).")
    args = parser.parse_args()
    default = Thresholds().progress_sample_seconds
    rows = [measure(args.seconds, every, args.children) for every in (default, 1.0)]
    print(json.dumps({"default_interval_seconds": default, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
