"""Small real targets for step tests: a git repo, a lock of tiny wheels, a bash 'trainer' that prints step lines."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

from relaunch import runlayout
from relaunch.config import Target, Thresholds
from relaunch.demo.target import git
from relaunch.demo.wheels import build_all

# A trainer in bash: step lines in the incident's format, fast, no torch.
# Its argument is a step or a checkpoint's path (`.../step_40.pt` resumes after step 40); START_SECONDS of start-up.
STEPPER = """#!/usr/bin/env bash
start=${1:-0}; start=${start##*_}; start=${start%%.*}
echo "loading"
sleep "${START_SECONDS:-0}"
for i in $(seq $((start + 1)) 100000); do
  echo "step=$i loss=3.6441 acc=0.097 lr=3.96e-04 | dft=0.50b/s (20.0Ktok/s) | q_hs=[2]"
  sleep "${STEP_SECONDS:-0.2}"
  [ -n "$EXIT_AT" ] && [ "$i" -ge "$EXIT_AT" ] && exit "${EXIT_CODE:-3}"
done
"""


def shell_target(tmp_path: Path, name: str = "t", **overrides) -> Target:
    repo = tmp_path / "repo"
    repo.mkdir(parents=True)
    (repo / "stepper.sh").write_text(STEPPER)
    (repo / "model.py").write_text("VALUE = 1\n")
    wheels = tmp_path / "wheels"
    build_all(wheels)
    (repo / "requirements.lock").write_text("tinyjunk==0.1.0\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "good")
    fields = dict(
        name=name,
        repo_dir=str(repo),
        restore_paths=["model.py"],
        venv_dir=str(tmp_path / "venv"),
        lock_file="requirements.lock",
        python=getattr(sys, "_base_executable", sys.executable),
        find_links=[str(wheels)],
        offline=True,
        import_check=["tinyjunk"],
        inductor_cache_dir=str(tmp_path / "inductor"),
        warmup_command=None,
        launch_command="bash stepper.sh",
        checkpoint_dir=str(tmp_path / "ckpt"),
        resume_arg="{checkpoint}",
        tmux_session=f"relaunch-test-{name}-{uuid.uuid4().hex[:8]}",
        log_dir=str(tmp_path / "logs"),
        state_dir=str(tmp_path / "state"),
        min_free_disk_gb=0.1,
        thresholds=Thresholds(
            startup_grace_seconds=30, poll_interval_seconds=0.5, settle_timeout_seconds=30, healthy_steps=3, stall_window_floor_seconds=3
        ),
    )
    fields.update(overrides)
    return Target(**fields)


def tmux_alive(session: str) -> bool:
    """Whether tmux has the session; a tmux that could not answer (a busy server) is an error, not a 'no'."""
    out = subprocess.run(["tmux", "has-session", "-t", f"={session}"], capture_output=True, text=True)
    # The last three: a server that was exiting (its last session gone) as it was asked.
    gone = (
        r"can't find session|no server running|error connecting to .*No such file|server exited unexpectedly|no current target|lost server"
    )
    if out.returncode != 0 and not re.search(gone, out.stderr):
        raise AssertionError(f"tmux could not say whether session {session} exists: exit {out.returncode}: {out.stderr.strip()}")
    return out.returncode == 0


def stop_all(*targets: Target) -> None:
    """Stop every trainer a test started, even when one stop complains, then check none is left."""
    from concurrent.futures import ThreadPoolExecutor

    from relaunch.plans.stop import plan_stop
    from relaunch.tasks.health import collect_snapshot
    from relaunch.wire.transport import run, transport_for

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda t: run(transport_for(t.host), plan_stop(t, 20), check=False), targets))
    left = [t.name for t in targets if collect_snapshot(t).pid_alive or tmux_alive(t.tmux_session)]
    assert not left, f"trainers still running after the stop: {left}"


def wait_for_exit(target: Target, timeout_seconds: float = 30) -> None:
    """Long-polls the host: each poll returns the moment the trainer exits."""
    import time

    from relaunch.tasks.health import collect_snapshot

    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if collect_snapshot(target, wait_seconds=2).exit_code is not None:
            return
    raise AssertionError(f"{target.name} never exited")


def finished(flow, **parameters):
    """Run a flow and return its report whether it ended Completed or Failed (a step's error is raised)."""
    from relaunch.flows.outcome import report_of

    return report_of(flow(**parameters, return_state=True))


def runs(target: Target) -> list[str]:
    """Run ids relaunch recorded for the target, oldest first (relaunch.runlayout names the folders)."""
    folder = Path(runlayout.runs_folder(target.state_path))
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def current(target: Target) -> str:
    return Path(runlayout.current_file(target.state_path)).read_text().strip()


def current_log(target: Target) -> Path:
    return Path(Path(runlayout.record(target.state_path, current(target), runlayout.LOG_PATH)).read_text().strip())


def step_detail(report, step: str, attempt: int | None = None):
    """The typed detail of a step in one attempt of a report, or of its first run in any attempt."""
    attempts = report.attempts if attempt is None else [report.attempts[attempt]]
    return next(s.detail for a in attempts for s in a.steps if s.step == step)
