"""Run a benchmark that prints JSON and keep that JSON, with the machine and the command, in bench/results/NAME.json.

    .venv/bin/python bench/record.py ssh_round_trips -- .venv/bin/python bench/ssh_round_trips.py
    .venv/bin/python bench/record.py fleet_checks -- .venv/bin/python bench/fleet_checks.py --max-concurrent 1,4,16

The benchmark's stderr passes through; its stdout must be one JSON document, kept whole under "result".
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.stats import machine  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="bench/results/NAME.json")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the benchmark's command line")
    args = parser.parse_args()
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not argv:
        parser.error("no command after --")
    before = machine()
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    wall = time.monotonic() - start
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{shlex.join(argv)} exited {proc.returncode} without JSON on stdout ({exc}):\n{proc.stdout[-2000:]}") from None
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {
        "name": args.name,
        "command": shlex.join(argv),
        "commit": commit,
        "exit_code": proc.returncode,
        "wall_seconds": round(wall, 1),
        "machine_before": before,
        "machine_after": machine(),
        "result": result,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{args.name}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"[record] {out.relative_to(ROOT)}: exit {proc.returncode}, {wall:.0f} s", file=sys.stderr)
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
