"""Every core busy: CPU hogs a test starts for its duration and kills after, by PID.

The judging tests must give the same verdicts on a loaded host (a nightly check runs beside other jobs, a gang's
ranks burn every core): a poll that comes late, a trainer that gets half a core, py-spy that attaches slowly.
`cpu_hogs()` starts one busy process per core (os.cpu_count()) at the same priority as the test's processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# A hog is a Python loop that never sleeps nor writes: it takes the scheduler's share of a core, nothing else.
HOG = "while True:\n    pass\n"


@contextmanager
def cpu_hogs(count: int | None = None) -> Iterator[list[int]]:
    """COUNT (default: one per core) busy processes, each in a session of its own; SIGKILLed and reaped after, by PID."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(count if count is not None else os.cpu_count() or 1):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", HOG],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            p.wait(timeout=30)
