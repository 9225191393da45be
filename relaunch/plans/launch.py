"""The host commands of a launch (relaunch/host/launch.sh) and of the checkpoint listing it chooses from; pure, no Prefect."""

from __future__ import annotations

from relaunch.commands import Command, script
from relaunch.config import Target
from relaunch.host import host_script
from relaunch.plans.leftovers import tracked
from relaunch.runfiles import log_path, state_identity, trainer_command, trainer_spec

LAUNCH, LAUNCHER, SUPERVISOR = host_script("launch"), host_script("launcher"), host_script("supervisor")
PID_WAIT_SECONDS = 30

# List checkpoint_dir NUL-separated (a name may hold a newline); the choice is made in Python. Checkpoints
# that failed to load are recorded (mtime and name) in the state folder (appended first when one is refused now)
# and listed as `S NAME` records: they are skipped, never renamed or deleted.
LIST_CHECKPOINTS = host_script("list_checkpoints")


def skipped_path(target: Target) -> str:
    return f"{target.state_path}/skipped-checkpoints"


def plan_list_checkpoints(target: Target, refuse: str | None = None) -> Command | None:
    """The listing the choice is made from; the state folder is passed so the current run's end (a stop's
    SIGTERM and SIGKILL, its exit code and when) is listed too."""
    if not target.checkpoint_dir:
        return None
    args = (target.checkpoint_dir, skipped_path(target), refuse or "", target.state_path)
    return script(LIST_CHECKPOINTS, *args, label="list checkpoints", timeout_seconds=120)


def plan_launch(target: Target, run_id: str, checkpoint: str | None) -> tuple[Command, str]:
    command = trainer_command(target, checkpoint)
    args = (target.state_path, target.tmux_session, run_id, log_path(target, run_id), SUPERVISOR, LAUNCHER, str(PID_WAIT_SECONDS))
    args += (target.venv_dir, target.inductor_cache_dir, checkpoint or "")
    # launch.sh's arguments 11-13; the trainer's spec follows them.
    args += (state_identity(target), target.legacy_state_path, target.checkpoint_dir or "", *trainer_spec(target, command))
    # Recorded while it runs, so a retry or the next recovery can tell a launch still under way from a lost one.
    launch = tracked(target, script(LAUNCH, *args, label="launch trainer in tmux", timeout_seconds=2 * PID_WAIT_SECONDS + 30))
    return launch, command
