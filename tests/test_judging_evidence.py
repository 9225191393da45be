"""A live run is judged from evidence, as an expert at the host would: what its processes do over a window of its own
history (the run's journal), never one look at its log. Real trainers in real tmux, launched by relaunch; each shape
below once killed a healthy run or resumed a hung one late.

The trainer (TRAINER) is a Python program whose shape comes from its environment: how it steps (computing between
step lines, or sleeping), where it writes (stdout, or a file of its own through `logging`), and how it hangs (idle in a
lock, or a thread spinning while the main thread waits)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from relaunch.config import Thresholds
from relaunch.judging.findings import Diagnosis
from relaunch.tasks.health import HealthResult, check_health
from relaunch.tasks.launch import launch
from relaunch.testing.faults import making, wait_for
from relaunch.vocabulary import Verdict

TRAINER = r"""
import logging, os, sys, threading, time

every = float(os.environ.get("STEP_EVERY", "0.3"))
busy = os.environ.get("BUSY") == "1"
hang_after = int(os.environ.get("HANG_AFTER", "0"))
gap_after, gap = int(os.environ.get("GAP_AFTER", "0")), float(os.environ.get("GAP", "0"))
own_log = os.environ.get("OWN_LOG")
say = print
if own_log:
    logging.basicConfig(filename=own_log, level=logging.INFO, format="%(message)s")
    say = logging.getLogger("train").info

# Work spread over several functions, as a real step is: a stack sample lands in a different place each time.
def attention(n): return sum(i * i for i in range(n))
def mlp(n): return sum(i + 1 for i in range(n))
def norm(n): return max(range(n))
def loss(n): return sum(range(n))
def backward(n):
    return attention(n) + mlp(n) + norm(n) + loss(n)

def compute(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        backward(20000)

step = 0
while True:
    step += 1
    say(f"step={step} loss=3.6441 acc=0.097 lr=3.96e-04 | (20.0Ktok/s)")
    if hang_after and step >= hang_after:
        open(os.environ["HUNG"], "w").close()
        if os.environ.get("SPIN") == "1":
            def heartbeat_check():  # a busy loop in user code: no wait frame, one and the same place
                while True:
                    pass
            threading.Thread(target=heartbeat_check, daemon=True).start()
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()  # never returns
    if step == gap_after:
        time.sleep(gap)  # quiet, as a GPU-bound stretch: no line, no CPU
    if busy:
        compute(every)
    else:
        time.sleep(every)
"""


@pytest.fixture
def made(tmp_path):
    with making(tmp_path) as make:
        yield make


def launched(made, tmp_path: Path, command: str = "{python} -u {trainer}", **env: str):
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    thresholds = Thresholds(
        startup_grace_seconds=1,
        poll_interval_seconds=0.5,
        settle_timeout_seconds=40,
        healthy_steps=3,
        stall_window_floor_seconds=2,
    )
    t = made(launch_command=command.format(python=sys.executable, trainer=trainer), env=env, thresholds=thresholds)
    launch.fn(t, 1)
    return t


def checks(target, seconds: float) -> list[HealthResult]:
    """Check after check (each a full check_health, as the nightly flow makes), for at least SECONDS."""
    results: list[HealthResult] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end or not results:
        results.append(check_health.fn(target))
    return results


def verdicts(results: list[HealthResult]) -> list[str]:
    return [f"{r.diagnosis.verdict.value}: {r.diagnosis.summary}" for r in results]


def never_stalled(results: list[HealthResult]) -> None:
    stalled: list[Diagnosis] = [r.diagnosis for r in results if r.diagnosis.verdict is Verdict.STALLED]
    assert not stalled, f"a working run was called stalled: {stalled[0].evidence}; all: {verdicts(results)}"


def test_a_computing_trainer_whose_step_lines_come_slower_than_the_stall_floor_is_never_called_stalled(made, tmp_path):
    # One step line every 3.5 s against a 2 s floor: its processes compute between the lines, and their stacks say so.
    t = launched(made, tmp_path, STEP_EVERY="3.5", BUSY="1")
    results = checks(t, 12)
    never_stalled(results)
    assert results[-1].diagnosis.metrics.last_step and results[-1].diagnosis.metrics.last_step >= 3


def test_a_trainer_behind_a_buffering_pipe_is_judged_by_its_processes_not_its_empty_log(made, tmp_path):
    # `| grep -v Warning`: grep holds the step lines in its buffer; the log stays empty while the trainer computes.
    t = launched(made, tmp_path, "{python} -u {trainer} 2>&1 | grep -v Warning", STEP_EVERY="1", BUSY="1")
    results = checks(t, 8)
    never_stalled(results)
    assert all(r.diagnosis.metrics.steps_seen == 0 for r in results), "grep flushed: the shape was not the one tested"


def test_a_trainer_that_logs_only_to_a_file_of_its_own_is_not_stalled_while_it_writes_there(made, tmp_path):
    # Python logging to its own file, nothing on stdout, and no CPU to speak of: the file it writes is the evidence.
    own = tmp_path / "own.log"
    t = launched(made, tmp_path, STEP_EVERY="0.5", OWN_LOG=str(own))
    wait_for(lambda: own.exists() and own.stat().st_size > 0, 20, "the trainer's own log")
    results = checks(t, 8)
    never_stalled(results)
    assert any(w.path == str(own) for w in results[-1].snapshot.writing), results[-1].snapshot.writing
    # The file it really writes is read for its steps: judged healthy, from that file's step lines.
    assert results[-1].snapshot.own_log == str(own)
    assert results[-1].diagnosis.verdict is Verdict.HEALTHY, verdicts(results)
    assert results[-1].diagnosis.metrics.last_step and results[-1].diagnosis.metrics.last_step > 3


def test_a_log_deleted_under_its_trainer_is_read_through_the_trainers_descriptor(made, tmp_path):
    t = launched(made, tmp_path, STEP_EVERY="0.3")
    first = wait_for(lambda: (r := check_health.fn(t)).diagnosis.verdict is Verdict.HEALTHY and r, 30, "a healthy run")
    log = Path(next((Path(t.state_path) / "runs").glob("*/log_path")).read_text().strip())
    os.unlink(log)  # to free disk, as people do
    later = checks(t, 3)
    never_stalled(later)
    assert later[-1].diagnosis.metrics.last_step > first.diagnosis.metrics.last_step, verdicts(later)


def test_a_hung_trainer_is_called_stalled_only_after_it_was_watched_for_its_window(made, tmp_path):
    hung = tmp_path / "hung"
    t = launched(made, tmp_path, STEP_EVERY="0.2", HANG_AFTER="5", HUNG=str(hung))
    wait_for(hung.exists, 30, "the trainer to hang")
    wait_for(lambda: any("step=5 " in log.read_text() for log in Path(t.log_dir).glob("*")), 30, "its last step line in the log")
    hung_at = time.monotonic()
    # Its log looks an hour old: one look at the clock would call it stalled at once.
    for log in (Path(t.log_dir)).glob("*"):
        os.utime(log, (time.time() - 3600, time.time() - 3600))
    results: list[HealthResult] = []
    wait_for(lambda: results.append(check_health.fn(t)) or results[-1].diagnosis.verdict is Verdict.STALLED, 60, "a stalled verdict")
    assert time.monotonic() - hung_at >= t.thresholds.stall_window_floor_seconds, "called stalled before a window of quiet"
    # The whole tree's record says why: nothing moved in it, not only no step line.
    evidence = results[-1].diagnosis.evidence
    assert any("no CPU, no I/O and no GPU activity in its whole tree" in line for line in evidence), evidence


def test_a_thread_spinning_while_the_main_thread_waits_is_work_by_its_cpu_never_a_hang_by_its_stacks_alone(made, tmp_path):
    # A polling thread keeps a core at 100 % while the main thread waits on a lock: the CPU rises, so the record says
    # work, and a frame alone never makes a hang (issue 50: one long native call looked the same to the stacks).
    hung = tmp_path / "hung"
    t = launched(made, tmp_path, STEP_EVERY="0.2", HANG_AFTER="5", HUNG=str(hung), SPIN="1")
    wait_for(hung.exists, 30, "the trainer to hang")
    results = checks(t, 4 * t.thresholds.stall_window_floor_seconds)
    never_stalled(results)
    assert any("its tree works" in line for line in results[-1].diagnosis.evidence) or results[-1].diagnosis.verdict is Verdict.HEALTHY


def test_every_check_journals_the_step_it_read_last_so_a_quiet_gap_shorter_than_ten_intervals_is_no_stall(made, tmp_path):
    # Steps every 0.5 s (a 5 s window by 10x), then 4 s of quiet (twice the 2 s floor), checks back to back: the checks
    # that settle at their first look journal the step they read, so the next one keeps the window.
    t = launched(made, tmp_path, STEP_EVERY="0.5", GAP_AFTER="12", GAP="4")
    results = checks(t, 14)
    never_stalled(results)
    journal = (Path(t.state_path) / "runs" / results[-1].snapshot.run_id / "journal").read_text().splitlines()
    steps = [int(line.split()[2]) for line in journal if line.startswith("S ")]
    assert steps and steps[-1] == results[-1].diagnosis.metrics.last_step, journal[-6:]
    settled_at_once = [r for r in results if r.polls == 1]
    assert len(settled_at_once) >= 3, verdicts(results)
    assert len(steps) >= sum(r.polls for r in results[1:]), "a check's last read step is journaled too"


def test_a_journal_trimmed_to_its_tail_keeps_the_steps_changes_so_the_step_interval_outlives_a_long_quiet_stretch(made, tmp_path):
    t = launched(made, tmp_path, STEP_EVERY="0.3")
    # Checks until the journal holds two steps (a loaded host's first check may settle at its first look: one step).
    changes: list[str] = []
    deadline = time.monotonic() + 60
    while len({line.split()[2] for line in changes}) < 2:
        assert time.monotonic() < deadline, changes
        first = check_health.fn(t)
        journal = Path(t.state_path) / "runs" / first.snapshot.run_id / "journal"
        changes = [line for line in journal.read_text().splitlines() if line.startswith("S ")]
    # Weeks of polls of a quiet stretch: 10000 `P` lines after the steps, past the journal's bound (256 KiB).
    last_poll = [line for line in journal.read_text().splitlines() if line.startswith("P ")][-1]
    with journal.open("a") as f:
        f.write((last_poll + "\n") * 10000)
    later = check_health.fn(t)
    kept = journal.read_text().splitlines()
    assert len(kept) < 2000, "the journal was trimmed"
    assert changes[0] in kept, "the first step change outlived the trim"
    assert later.snapshot.journal_steps[0].step == int(changes[0].split()[2]), "and was sent ahead of the tail"
