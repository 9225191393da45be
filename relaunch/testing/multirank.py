"""The multi-rank trainer's helpers (tests/test_multirank.py, bench/gpu_multirank/scenario.py): demo/trainer/multirank.py
under torchrun, two ranks; the processes of the run relaunch recorded, its checkpoints, its log, and a report as told.

What relaunch records: `STATE/runs/ID/supervisor_pid` leads the process group; `STATE/runs/ID/pid` is the
supervisor's `bash -c "<launch command>"`, which execs the single command it is given, so the recorded trainer PID
is torchrun itself. Its ranks are torchrun's children (each with RANK in its environment) but each leads a session
and group of its own (torch's elastic SubprocessHandler: `start_new_session=True`), so "the old run" is the
supervisor's group plus every descendant of the recorded trainer.
"""

from __future__ import annotations

import sys
from pathlib import Path

from relaunch import runlayout
from relaunch.config import Target, Thresholds
from relaunch.judging.diagnosis import diagnose
from relaunch.records.report import Report
from relaunch.tasks.health import collect_snapshot
from relaunch.tasks.launch import launch
from relaunch.testing.faults import descendants, environ, group_members, start_time, wait_for
from relaunch.testing.targets import current
from relaunch.vocabulary import Verdict

ROOT = Path(__file__).resolve().parents[2]
MULTIRANK = ROOT / "demo" / "trainer" / "multirank.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
THRESHOLDS = Thresholds(
    startup_grace_seconds=90, poll_interval_seconds=0.3, settle_timeout_seconds=90, healthy_steps=3, stall_window_floor_seconds=5
)


def multirank_command(checkpoints: Path, *extra: str, device: str = "cpu", torchrun: Path = TORCHRUN, trainer: Path = MULTIRANK) -> str:
    """torchrun, 2 ranks; --standalone picks a free rendezvous port, so tests running side by side never meet."""
    return " ".join(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node 2",
            str(trainer),
            f"--device {device}",
            f"--checkpoint-dir {checkpoints}",
            "--checkpoint-every 5",
            "--step-seconds 0.05",
            *extra,
        ]
    )


def recorded(target: Target, name: str) -> int:
    """A PID relaunch recorded for the current run (`pid` or `supervisor_pid`)."""
    return int(Path(runlayout.runs_folder(target.state_path), current(target), name).read_text().split()[0])


def rank_pids(target: Target) -> dict[int, int]:
    """{rank: PID} of the current run's ranks: processes under the recorded trainer with RANK set by torchrun."""
    ranks = {}
    for pid in descendants(recorded(target, "pid")):
        env = environ(pid)
        if "RANK" in env and "TORCHELASTIC_RUN_ID" in env:
            ranks[int(env["RANK"])] = pid
    return ranks


def old_group(target: Target) -> dict[int, str]:
    """Every live process of the current run, with its start time: the supervisor's process group, and every
    descendant of the recorded trainer (torchrun's ranks run in sessions of their own, outside that group)."""
    members = {*group_members(recorded(target, "supervisor_pid")), *descendants(recorded(target, "pid"))}
    return {pid: start for pid in members if (start := start_time(pid))}


def still_alive(group: dict[int, str]) -> list[int]:
    return [pid for pid, start in group.items() if start_time(pid) == start]


def checkpoints(folder: Path) -> list[Path]:
    return sorted(folder.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))


def told(report: Report) -> str:
    return "\n".join(
        [
            *report.timeline(),
            *(f"  evidence {a.number}: {line}" for a in report.attempts for line in a.evidence),
            *(f"  step {a.number}: {s.step} {s.detail}" for a in report.attempts for s in a.steps),
            f"  message: {report.message}",
        ]
    )


def run_log(target: Target, run_id: str) -> str:
    return Path(Path(runlayout.record(target.state_path, run_id, runlayout.LOG_PATH)).read_text().strip()).read_text()


def two_ranks_stepping(target: Target, ckpt: Path, at_least: int) -> dict[int, int]:
    """Launch, then wait until both ranks run and rank 0 has written `at_least` checkpoints."""
    launch.fn(target, 1)
    ranks = wait_for(lambda: (r := rank_pids(target)) and len(r) == 2 and r, 60, "torchrun to start two ranks")
    wait_for(lambda: len(checkpoints(ckpt)) >= at_least, 60, f"{at_least} checkpoints", interval=0.1)
    trainer = recorded(target, "pid")
    assert Path(f"/proc/{trainer}/cmdline").read_bytes().split(b"\0")[1].endswith(b"torchrun"), (
        "the recorded trainer PID is torchrun itself (bash -c execs the single command)"
    )
    return ranks


def polled_verdict(target: Target) -> Verdict:
    return diagnose(collect_snapshot(target, wait_seconds=0.5), target.thresholds, min_free_disk_gb=target.min_free_disk_gb).verdict
