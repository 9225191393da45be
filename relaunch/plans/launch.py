"""The host commands of a launch (relaunch/host/launch.sh) and of the checkpoint listing it chooses from; pure, no Prefect."""

from __future__ import annotations

import shlex

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.plans.leftovers import tracked
from relaunch.runlayout import log_path, state_identity
from relaunch.wire.commands import Command, script

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
    # launch.sh's arguments 11-14; the trainer's spec follows them.
    args += (
        state_identity(target),
        target.legacy_state_path,
        target.checkpoint_dir or "",
        f"{target.thresholds.progress_sample_seconds:g}",
    )
    args += tuple(trainer_spec(target, command))
    # Recorded while it runs, so a retry or the next recovery can tell a launch still under way from a lost one.
    launch = tracked(target, script(LAUNCH, *args, label="launch trainer in tmux", timeout_seconds=2 * PID_WAIT_SECONDS + 30))
    return launch, command


def trainer_env(target: Target) -> dict[str, str]:
    """What warm-up and trainer share, so the warmed kernels are the ones training looks up.

    PYTHONUNBUFFERED=1 unless the target sets it or says `unbuffered: false`: the trainer's stdout is a pipe to
    the log writer, so Python would buffer it in blocks, and step lines arriving in bursts read as a stall.

    TRITON_HOME inside the compile cache unless the target places Triton's cache itself: Triton builds its CUDA driver
    module (`cuda_utils*.so`) under $HOME/.triton/cache, not under TORCHINDUCTOR_CACHE_DIR, and that module cut short
    kills every start with SIGBUS (tests/fixtures/logs/gpu/cache_so_half.log). Inside the cache, moving the cache aside
    cures it, and one target's Triton build never serves another's.
    """
    env = {"TORCHINDUCTOR_CACHE_DIR": target.inductor_cache_dir, "VIRTUAL_ENV": target.venv_dir}
    if not {"TRITON_HOME", "TRITON_CACHE_DIR"} & target.env.keys():
        env["TRITON_HOME"] = f"{target.inductor_cache_dir}/triton_home"
    if target.unbuffered and "PYTHONUNBUFFERED" not in target.env:
        env["PYTHONUNBUFFERED"] = "1"
    return {**env, **target.env}


def trainer_spec(target: Target, command: str) -> list[str]:
    """What the supervisor reads from the run folder, NUL-separated: repo, venv bin, command, then KEY=VALUE entries."""
    return [target.repo_dir, f"{target.venv_dir}/bin", command, *(f"{k}={v}" for k, v in trainer_env(target).items())]


def trainer_command(target: Target, checkpoint: str | None) -> str:
    """launch_command, plus resume_arg with the checkpoint's path quoted once for the shell that runs it.

    With `resume_from: folder` {checkpoint} is checkpoint_dir itself (Megatron's --load reads the folder's
    tracker); relaunch still chose `checkpoint`, the one that loader will take, and records it.
    """
    if not checkpoint:
        return target.launch_command
    path = target.checkpoint_dir if target.resume_from == "folder" and target.checkpoint_dir else checkpoint
    # replace, not format(): resume_arg is validated to hold only {checkpoint}, and format() would also
    # read `{{` as an escape the user did not mean here.
    return f"{target.launch_command} {target.resume_arg.replace('{checkpoint}', shlex.quote(path))}"
