"""The health poll finds the earliest failures in the trainer's log by reading only what was written since the
last poll (RUN/scan), so a multi-gigabyte log costs a poll its new bytes, not the whole file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tasks.health import collect_snapshot
from tasks.launch import launch
from tests.faults import making
from tests.targets import current_log

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
