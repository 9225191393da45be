"""Wall time of a README command (`make test`, `make demo`, `.ci/run`), with pytest's own tally when it prints one.

Runs the command in the repository (or --cwd, e.g. a fresh clone for the README's "from a fresh clone"
figure), passes its output through to stderr, and prints JSON: the command, exit code, wall seconds, the
machine, and pytest's final summary line parsed into counts (passed, failed, skipped, ...) where there is one.

    .venv/bin/python bench/suite_time.py                        # make demo (about a minute)
    .venv/bin/python bench/suite_time.py --command 'make test'  # the whole suite (about 11 minutes on 2 cores)
    git clone -q . /tmp/fresh && .venv/bin/python bench/suite_time.py --cwd /tmp/fresh --command .ci/run
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.stats import machine  # noqa: E402

# pytest -q's last line: "197 passed, 2 skipped, 3 warnings in 645.12s (0:10:45)"
SUMMARY = re.compile(r"^=*\s*(?P<counts>(?:\d+ \w+(?:, )?)+) in (?P<seconds>[\d.]+)s\b.*$", re.MULTILINE)


def pytest_tally(output: str) -> dict | None:
    found = list(SUMMARY.finditer(output))
    if not found:
        return None
    last = found[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last.group("counts"))}
    return {"line": last.group(0).strip("= "), "pytest_seconds": float(last.group("seconds")), **counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--command", default="make demo", help="The command to time, as a shell would split it.")
    parser.add_argument("--cwd", type=Path, default=ROOT, help="Where to run it (default: this checkout).")
    args = parser.parse_args()
    argv = shlex.split(args.command)
    before = machine()
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=args.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    captured = []
    for line in proc.stdout:
        sys.stderr.write(line)
        captured.append(line)
    rc = proc.wait()
    wall = time.monotonic() - start
    output = "".join(captured)
    commit = subprocess.run(["git", "-C", str(args.cwd), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(args.cwd), "status", "--porcelain"], capture_output=True, text=True).stdout.strip() != ""
    print(
        json.dumps(
            {
                "command": args.command,
                "cwd": str(args.cwd),
                "commit": commit,
                "uncommitted_changes": dirty,
                "exit_code": rc,
                "wall_seconds": round(wall, 1),
                "wall": "{} min {} s".format(*divmod(round(wall), 60)),
                "pytest": pytest_tally(output),
                "machine_before": before,
                "machine_after": machine(),
                "output_tail": output[-2000:],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
