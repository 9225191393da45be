"""A multi-rank trainer recovered as one: torchrun, two ranks, gloo on the CPU (nccl on GPUs: bench/gpu_multirank).

The trainer is demo/trainer/multirank.py under this venv's real torchrun. Both faults are real:
- a rank SIGKILLed from outside: torchrun ends the other rank and names the dead one as its root cause;
  relaunch must say which rank died (not torchrun's ChildFailedError), leave no process of the old group,
  and resume from the newest checkpoint;
- a rank stuck (alive, sleeping in its data loader) while the other waits for it in the gradient
  all_reduce: relaunch must call it stalled and keep both ranks' stacks (py-spy) before the stop.

What relaunch records: `STATE/runs/ID/supervisor_pid` leads the process group; `STATE/runs/ID/pid` is the
supervisor's `bash -c "<launch command>"`, which execs the single command it is given, so the recorded
trainer PID is torchrun itself (its comm is `pt_elastic`). The ranks are torchrun's children (each with
RANK in its environment) but NOT members of that process group: torch's elastic SubprocessHandler starts
every rank with `start_new_session=True`, so each rank leads a session and group of its own. "The old run"
below is therefore the supervisor's group plus every descendant of the recorded trainer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from relaunch.config import Target
from relaunch.flows.recover import recover_training
from relaunch.records.report import Report
from relaunch.tasks.stop import stop
from relaunch.testing.faults import MID_STEP, ONE, case, live_trainers, reap, start_time, wait_for
from relaunch.testing.multirank import (
    THRESHOLDS,
    TORCHRUN,
    checkpoints,
    multirank_command,
    old_group,
    polled_verdict,
    rank_pids,
    recorded,
    run_log,
    still_alive,
    told,
    two_ranks_stepping,
)
from relaunch.testing.sshd import cannot_run_here
from relaunch.testing.targets import current, runs, shell_target, step_detail, wait_for_exit
from relaunch.vocabulary import Action, Cause, Verdict

pytestmark = pytest.mark.usefixtures("prefect_harness")


# ---------------------------------------------------------------------------------------------
# Processes of this test's own (the run's: relaunch/testing/multirank.py)


def started_under(folder: Path) -> list[int]:
    """Live processes whose command line names `folder` (a test's unique tmp_path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(folder) in cmdline and start_time(int(entry.name)):
                found.append(int(entry.name))
    return found


# ---------------------------------------------------------------------------------------------
# Set-up


@pytest.fixture
def made(tmp_path):
    """Targets on this machine with a venv in place; every trainer (and every rank) stopped afterwards, even on failure."""
    if not TORCHRUN.is_file():
        cannot_run_here(f"no torchrun beside {sys.executable}")
    targets: list[Target] = []

    def make(**overrides) -> Target:
        t = shell_target(
            tmp_path / f"target{len(targets)}",
            thresholds=THRESHOLDS,
            resume_arg="--resume {checkpoint}",
            env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
            **overrides,
        )
        subprocess.run(["uv", "venv", "-q", "--python", t.python, t.venv_dir], check=True)
        targets.append(t)
        return t

    yield make
    try:
        for t in targets:
            try:
                stop.fn(t)
            finally:
                reap(t)
    finally:
        # Ranks run outside the recorded process groups and can outlive their torchrun: end every process
        # of this test's own (its command line names this test's unique tmp_path).
        for pid in started_under(tmp_path):
            os.kill(pid, signal.SIGKILL)


def recover(target: Target) -> Report:
    state = recover_training(target, return_state=True)
    report = state.result(raise_on_failure=False)
    assert isinstance(report, Report), f"the flow ended {state.type} without a report: {report!r}"
    return report


# ---------------------------------------------------------------------------------------------
# 1. A rank killed for real


@case(
    MID_STEP,
    "one rank of a 2-rank torchrun trainer (gloo) SIGKILLed for real",
    "crashed / killed naming the rank that failed first (torchrun's root cause, not its ChildFailedError); every old process gone; relaunched from the newest checkpoint; healthy",
)
def test_a_killed_rank_is_named_the_whole_group_stopped_and_the_run_resumed_from_the_newest_checkpoint(made, tmp_path):
    ckpt = tmp_path / "ckpt"
    t = made(launch_command=multirank_command(ckpt), checkpoint_dir=str(ckpt))
    ranks = two_ranks_stepping(t, ckpt, at_least=2)
    group = old_group(t)
    assert set(ranks.values()) <= set(group), (ranks, group)
    victim = ranks[1]
    os.kill(victim, signal.SIGKILL)
    wait_for_exit(t, 60)  # torchrun ends rank 0 and exits on its own
    (first_run,) = runs(t)
    newest = checkpoints(ckpt)[-1]
    newest_step = int(newest.stem.split("_")[1])

    report = recover(t)
    first = report.attempts[0]
    assert (first.verdict, first.cause, first.action) == (Verdict.CRASHED, Cause.KILLED, Action.RELAUNCH), told(report)
    assert first.summary.startswith(f"rank 1 (local_rank 1, pid {victim}, host "), told(report)
    assert "died of SIGKILL" in first.summary and "ChildFailedError" not in first.summary, told(report)
    assert first.evidence[0] == first.summary, told(report)
    assert not still_alive(group), f"processes of the old group still alive: {still_alive(group)}"
    assert step_detail(report, "launch").checkpoint == str(newest), told(report)
    assert report.verdict is Verdict.HEALTHY and report.ok, told(report)
    second_run = current(t)
    assert runs(t) == [first_run, second_run], runs(t)
    assert f"resumed from {newest} at step {newest_step}" in run_log(t, second_run)
    assert f"step={newest_step + 1} " in run_log(t, second_run)
    assert len(rank_pids(t)) == 2 and len(live_trainers(t)) == 1


# ---------------------------------------------------------------------------------------------
# 2. One rank stuck, every rank alive


def wheelhouse_or_skip() -> str:
    from relaunch.demo.target import wheelhouse

    try:
        path = wheelhouse()
    except SystemExit as exc:
        cannot_run_here(str(exc))
    if not list(path.glob("py_spy-*.whl")):
        cannot_run_here(f"no py-spy wheel in {path}: run `make setup`")
    return str(path)


@case(
    MID_STEP,
    "one rank of a 2-rank trainer hangs while the other waits in the collective",
    "stalled; both ranks' Python stacks kept (py-spy, found by the run's environment marker though torchrun puts ranks in sessions of their own); stopped; relaunched; healthy",
)
def test_a_rank_hung_before_a_collective_is_stalled_with_both_ranks_stacks_kept_then_relaunched(made, tmp_path):
    ckpt, once = tmp_path / "ckpt", tmp_path / "hung-once"
    t = made(
        launch_command=multirank_command(ckpt, "--hang-rank 1 --hang-after 12", f"--hang-marker {once}"),
        checkpoint_dir=str(ckpt),
    )
    t.find_links = [*t.find_links, wheelhouse_or_skip()]  # py-spy, offline
    ranks = two_ranks_stepping(t, ckpt, at_least=1)
    wait_for(once.exists, 60, "rank 1 to hang")
    wait_for(lambda: polled_verdict(t) is Verdict.STALLED, 60, "the hung run to look stalled to a poll", interval=0.5)
    group = old_group(t)
    assert set(ranks.values()) <= set(group) and not set(ranks.values()) - set(still_alive(group)), "every rank alive"

    report = recover(t)
    first = report.attempts[0]
    assert (first.verdict, first.action) == (Verdict.STALLED, Action.DUMP_AND_RELAUNCH), told(report)
    assert [s.step for s in first.steps] == ["capture_stacks", "stop", "launch"], told(report)
    stacks = step_detail(report, "capture_stacks")
    assert not stacks.skipped, stacks
    dump = Path(stacks.stacks_file).read_text()
    sections = {pid: text for pid, text in (_section(part) for part in dump.split("=== py-spy dump --pid ")[1:])}
    missing = [rank for rank, pid in ranks.items() if pid not in sections]
    assert not missing, (
        "BUG relaunch/host/dump_stacks.sh: it dumps only the members of the supervisor's process group (pgid == supervisor PID), "
        "but torchrun starts every rank in a session of its own (torch.distributed.elastic SubprocessHandler: start_new_session=True), "
        f"so no rank's stack is kept, only torchrun's; ranks {missing} (PIDs {[ranks[r] for r in missing]}) missing from:\n{dump}"
    )
    assert "fetch_batch (" in sections[ranks[1]] and "fetch_batch (" not in sections[ranks[0]], dump
    assert "all_reduce_grads (" in sections[ranks[0]] and "all_reduce (" in sections[ranks[0]], dump
    frames = stacks.top_frames
    assert any(line.startswith("MainThread ") and "fetch_batch (multirank.py:" in line for line in frames), frames
    assert any(line.startswith("MainThread ") and "all_reduce (" in line for line in frames), frames
    assert not still_alive(group), f"processes of the old group still alive: {still_alive(group)}"
    assert report.verdict is Verdict.HEALTHY and report.ok and len(runs(t)) == 2, told(report)
    newest = step_detail(report, "launch").checkpoint
    assert newest and f"resumed from {newest}" in run_log(t, current(t)), told(report)


def _section(part: str) -> tuple[int, str]:
    head, _, body = part.partition("\n")
    return int(head.split()[0]), body


# ---------------------------------------------------------------------------------------------
# 3. torchrun itself killed: its ranks live on


@case(
    ONE,
    "torchrun itself SIGKILLed: its ranks, in sessions of their own, live on",
    "the stop finds them by the run's environment marker (`RELAUNCH_RUN`) and ends them before the relaunch: never two sets of ranks",
)
def test_ranks_left_running_by_a_killed_torchrun_are_stopped_before_the_relaunch(made, tmp_path):
    ckpt = tmp_path / "ckpt"
    t = made(launch_command=multirank_command(ckpt), checkpoint_dir=str(ckpt))
    ranks = two_ranks_stepping(t, ckpt, at_least=1)
    group = old_group(t)
    os.kill(recorded(t, "pid"), signal.SIGKILL)  # torchrun itself (the kernel's OOM killer picks big agents too)
    wait_for_exit(t, 30)  # the supervisor records 137
    assert set(ranks.values()) <= set(still_alive(group)), "the ranks outlive torchrun, reparented to init"

    report = recover(t)
    assert report.attempts[0].verdict is Verdict.CRASHED, told(report)
    left = [pid for pid in ranks.values() if pid in still_alive(group)]
    assert not left, f"ranks {left} of the killed run still train beside the relaunched one ({rank_pids(t)}):\n{told(report)}"
