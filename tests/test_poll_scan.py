"""The health poll finds the earliest failures in the trainer's log by reading only what was written since the
last poll (RUN/scan), so a multi-gigabyte log costs a poll its new bytes, not the whole file."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from relaunch.tasks.health import collect_snapshot
from relaunch.tasks.launch import launch
from relaunch.testing.faults import making, wait_for
from relaunch.testing.targets import current_log

LOGS = Path(__file__).parent / "fixtures" / "logs"
FIXTURE = LOGS / "cpu" / "generic_error.log"  # a real DataLoader crash
# The last line of a real illegal memory access on an H200.
CUDA_ERROR = next(line for line in (LOGS / "gpu" / "illegal_memory_access.log").read_text().splitlines() if "illegal memory access" in line)
STEP = "step={} loss=3.6441 acc=0.097 lr=3.96e-04 | dft=0.50b/s (20.0Ktok/s) | q_hs=[2]\n"


def steps(first: int, count: int) -> str:
    return "".join(STEP.format(i) for i in range(first, first + count))


@pytest.fixture
def log(tmp_path):
    """A live trainer that writes nothing itself: the test writes its log."""
    with making(tmp_path, launch_command="exec sleep 600") as make:
        target = make()
        launch.fn(target, 1)
        path = current_log(target)
        yield target, path


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def test_a_failure_written_after_earlier_polls_is_found_with_the_lines_before_it(log):
    target, path = log
    append(path, steps(1, 2000))
    assert collect_snapshot(target).log_matches == []
    append(path, FIXTURE.read_text() + steps(2001, 300))  # followed by more than the tail holds
    matches = collect_snapshot(target).log_matches
    assert "Traceback (most recent call last):" in matches, matches
    assert any(line.startswith("step=2043 ") for line in matches), "the lines before the failure come with it"
    assert collect_snapshot(target).log_matches == matches, "a later poll says the same"


def test_a_poll_reads_only_bytes_written_since_the_last_one_and_a_truncated_log_from_the_start(log):
    target, path = log
    append(path, steps(1, 3000))  # ~250 KiB: its start lies well before the 64 KiB a new scan re-reads
    collect_snapshot(target)
    # Rewritten in place, same size: a log is only ever appended to, so the poll does not read it again.
    with open(path, "r+b") as f:
        f.seek(len(STEP.format(1)))
        old = f.read(len(STEP.format(2)))
        f.seek(len(STEP.format(1)))
        f.write(CUDA_ERROR.encode()[: len(old) - 1].ljust(len(old) - 1) + b"\n")
    assert collect_snapshot(target).log_matches == []
    # A log that shrank was replaced: scanned again from its first byte.
    with open(path, "w") as f:
        f.write(FIXTURE.read_text() + steps(1, 300))
    assert "Traceback (most recent call last):" in collect_snapshot(target).log_matches


def test_a_failure_line_cut_in_half_by_a_poll_is_found_once_it_is_whole(log):
    target, path = log
    half = CUDA_ERROR.index("Error") + 2
    append(path, steps(1, 3000) + CUDA_ERROR[:half])  # the trainer is mid-write when the poll comes: "...Er"
    assert collect_snapshot(target).log_matches == []
    append(path, CUDA_ERROR[half:] + "\n" + steps(3001, 300))
    matches = collect_snapshot(target).log_matches
    assert CUDA_ERROR in matches, matches
    assert os.path.getsize(path) > 256 << 10


def test_a_waiting_poll_asked_to_wake_on_the_log_returns_at_the_first_line_written_since_the_last_poll(log):
    target, path = log
    append(path, steps(1, 2))
    collect_snapshot(target)
    (mark,) = Path(target.state_path).glob("runs/*/poll_mark")
    with ThreadPoolExecutor(1) as pool:
        start = time.monotonic()
        poll = pool.submit(collect_snapshot, target, 60, True)
        # Past the clock tick of the last poll's mark (the file system's clock is coarse), wherever the new poll is.
        wait_for(lambda: time.time_ns() > mark.stat().st_mtime_ns + 50_000_000, 5, "the clock to pass the mark")
        append(path, steps(3, 1))
        snap = poll.result(timeout=30)
    assert snap.log_tail[-1].startswith("step=3 "), snap.log_tail[-3:]
    assert time.monotonic() - start < 30, "the poll returned at the line, long before its 60 s"
    start = time.monotonic()
    assert collect_snapshot(target, 1.0, True).log_tail[-1].startswith("step=3 ")
    assert time.monotonic() - start >= 1.0, "with nothing written since, a waking poll waits its whole time"


def test_a_waiting_poll_not_asked_to_wake_waits_its_whole_time_however_much_is_written(log):
    target, path = log
    stop = threading.Event()

    def chatter() -> None:
        i = 1
        while not stop.wait(0.05):
            append(path, steps(i, 1))
            i += 1

    writer = threading.Thread(target=chatter)
    writer.start()
    try:
        start = time.monotonic()
        snap = collect_snapshot(target, 1.5)
        elapsed = time.monotonic() - start
    finally:
        stop.set()
        writer.join()
    assert elapsed >= 1.5 and len(snap.log_tail) > 5, (elapsed, len(snap.log_tail))


def test_a_start_up_poll_wakes_at_once_at_a_step_line_but_only_once_per_floor_for_compile_lines(log):
    target, path = log
    append(path, "loading shards\n")
    collect_snapshot(target)  # the last poll: its mark and how far it read
    stop = threading.Event()

    def compiling() -> None:  # a start-up's chatter: no step, no rate
        i = 1
        while not stop.wait(0.05):
            append(path, f"[inductor] compiling graph {i} of many\n")
            i += 1

    writer = threading.Thread(target=compiling)
    writer.start()
    try:
        # Any write may wake it only after 5 s; a line like progress after 0.2 s.
        start = time.monotonic()
        collect_snapshot(target, 1.5, True, None, None, 5.0, 0.2)
        assert time.monotonic() - start >= 1.5, "compile lines alone do not wake the poll before its floor"
        (mark,) = Path(target.state_path).glob("runs/*/poll_mark")
        with ThreadPoolExecutor(1) as pool:
            start = time.monotonic()
            poll = pool.submit(collect_snapshot, target, 30, True, None, None, 5.0, 0.2)
            wait_for(lambda: time.time_ns() > mark.stat().st_mtime_ns + 50_000_000, 5, "the clock to pass the mark")
            append(path, steps(1, 1))
            snap = poll.result(timeout=60)
    finally:
        stop.set()
        writer.join()
    assert any(line.startswith("step=1 ") for line in snap.log_tail), snap.log_tail[-3:]
    assert time.monotonic() - start < 4.5, "the step line woke the poll, long before the 5 s floor for any write"
