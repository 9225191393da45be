"""`relaunch diagnose` on a 2 GB log: wall time and peak memory of the whole CLI process.

The log is made in a temp folder (removed after) from real captured output: an earlier attempt's
crash near the start (cpu/generic_error.log), a 200 MB line (a tensor printed with no line width),
then step lines with rich colour codes and tqdm `\\r` redraws mixed in, and a final coloured crash
(ansi_colored_traceback.log) at the end. Prints one JSON line. The log is in the page cache when
diagnose reads it (just written): this measures relaunch, not the disk.

Usage: python bench/diagnose_big_log.py [--gb 2] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

REPO = Path(__file__).resolve().parent.parent
LOGS = REPO / "tests" / "fixtures" / "logs"
sys.path.insert(0, str(REPO / "bench" / "cpu_capture"))

from _steps import step_line  # noqa: E402

BLOCK_LINES = 40_000


def step_block() -> bytes:
    """About 7 MB of step lines; one in ten coloured by rich, and one real tqdm redraw run."""
    from rich.console import Console

    colour = Console(file=io.StringIO(), force_terminal=True, color_system="256", width=240, soft_wrap=True)
    plain = io.StringIO()
    with contextlib.redirect_stdout(plain):
        for step in range(BLOCK_LINES):
            step_line(step, seed=11)
    lines = plain.getvalue().splitlines(keepends=True)
    for i in range(0, len(lines), 10):
        colour.print(lines[i].rstrip())
    coloured = colour.file.getvalue().splitlines(keepends=True)  # type: ignore[attr-defined]
    for n, i in enumerate(range(0, len(lines), 10)):
        lines[i] = coloured[n]
    progress = (LOGS / "carriage_return_progress.log").read_bytes().decode()  # read_text would turn `\r` into `\n`
    bar = progress[progress.index("\r") :]  # the tqdm part, without the warning lines before it
    lines.insert(len(lines) // 2, bar.rstrip("\n") + "\n")
    return "".join(lines).encode()


def write_tensor_line(out: BinaryIO, size: int) -> None:
    """One line of printed floats, as `print(t)` gives with linewidth set huge; written in pieces."""
    r = random.Random(0)
    piece = ", ".join(f"{r.uniform(-1, 1):.4f}" for _ in range(100_000)).encode() + b", "
    out.write(b"tensor([")
    for _ in range(size // len(piece)):
        out.write(piece)
    out.write(b"0.0000])\n")


def write_log(path: Path, total: int) -> int:
    first_crash = (LOGS / "cpu" / "generic_error.log").read_bytes()
    last_crash = (LOGS / "ansi_colored_traceback.log").read_bytes()
    block = step_block()
    with path.open("wb") as out:
        out.write(first_crash)
        out.write(b"[relaunch] attempt 2\n")
        out.write(block)
        write_tensor_line(out, 200 * 1000 * 1000)
        written = out.tell()
        while written + len(last_crash) < total:
            written += out.write(block)
        out.write(last_crash)
        return out.tell()


def diagnose(log: Path) -> tuple[float, float, dict]:
    """Run from a fresh interpreter: a child's ru_maxrss includes the RSS of the process it was forked from."""
    run = subprocess.run([sys.executable, __file__, "--measure", str(log)], capture_output=True, text=True, timeout=660)
    if run.returncode != 0:
        raise SystemExit(run.stderr[-2000:])
    wall, peak_mb, out = json.loads(run.stdout)
    return wall, peak_mb, out


def measure(log: Path) -> None:
    started = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "relaunch.cli", "diagnose", str(log), "--exit-code", "1", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - started
    # diagnose exits 1 for a verdict that is not healthy, starting or finished (this log's is crashed).
    if run.returncode not in (0, 1):
        raise SystemExit(f"diagnose exited {run.returncode}: {run.stderr[-2000:]}")
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps([wall, peak_mb, {"output_bytes": len(run.stdout), **json.loads(run.stdout)}]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0, help="Log size in GB (10^9 bytes).")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="Where the temp folder goes.")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # internal: the fresh interpreter's part
    args = parser.parse_args()
    if args.measure:
        return measure(args.measure)
    total = int(args.gb * 1e9)
    if shutil.disk_usage(args.dir).free < total + (1 << 30):
        raise SystemExit(f"{args.dir} has less than {args.gb} GB + 1 GiB free; pick another with --dir")
    work = Path(tempfile.mkdtemp(prefix="relaunch-big-log-", dir=args.dir))
    try:
        log = work / "train.log"
        size = write_log(log, total)
        wall, peak_mb, out = diagnose(log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    evidence = [re.sub(r"\s+", " ", line)[:120] for line in out["evidence"]]
    print(
        json.dumps(
            {
                "log_bytes": size,
                "wall_seconds": round(wall, 2),
                "peak_rss_mb": round(peak_mb, 1),
                "verdict": out["verdict"],
                "cause": out["cause"],
                "last_step": out["metrics"]["last_step"],
                "output_bytes": out["output_bytes"],
                "evidence": evidence,
            }
        )
    )


if __name__ == "__main__":
    main()
