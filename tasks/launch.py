"""Step 6: start the trainer detached in tmux through the static launcher and supervisor; resume from the newest checkpoint."""

from __future__ import annotations

from relaunch.checkpoints import Choice, choose, parse_listing
from relaunch.commands import Command, script
from relaunch.config import Target
from relaunch.host import host_script
from relaunch.runfiles import log_path, new_run_id, trainer_command, trainer_spec
from relaunch.steps import LaunchDetail, Step, StepRecord
from tasks.common import execute, log, step_task, timed
from tasks.leftovers import tracked

LAUNCH, LAUNCHER, SUPERVISOR = host_script("launch"), host_script("launcher"), host_script("supervisor")
PID_WAIT_SECONDS = 30

# List checkpoint_dir NUL-separated (a name may hold a newline); the choice is made in Python. Checkpoints
# that failed to load are recorded (mtime and name) in the state folder (appended first when one is refused now)
# and listed as `S NAME` records: they are skipped, never renamed or deleted.
LIST_CHECKPOINTS = host_script("list_checkpoints")


def skipped_path(target: Target) -> str:
    return f"{target.state_path}/skipped-checkpoints"


def plan_list_checkpoints(target: Target, refuse: str | None = None) -> Command | None:
    if not target.checkpoint_dir:
        return None
    return script(
        LIST_CHECKPOINTS, target.checkpoint_dir, skipped_path(target), refuse or "", label="list checkpoints", timeout_seconds=120
    )


def plan_launch(target: Target, run_id: str, checkpoint: str | None) -> tuple[Command, str]:
    command = trainer_command(target, checkpoint)
    args = (target.state_path, target.tmux_session, run_id, log_path(target, run_id), SUPERVISOR, LAUNCHER, str(PID_WAIT_SECONDS))
    args += (target.venv_dir, target.inductor_cache_dir, checkpoint or "", *trainer_spec(target, command))
    # Recorded while it runs, so a retry or the next recovery can tell a launch still under way from a lost one.
    launch = tracked(target, script(LAUNCH, *args, label="launch trainer in tmux", timeout_seconds=2 * PID_WAIT_SECONDS + 30))
    return launch, command


def pick_checkpoint(target: Target, listing: str | None, before_step: int | None = None) -> Choice:
    """The newest usable checkpoint from the host's listing, or none, with the reason either way."""
    if listing is None:
        return Choice(why="no checkpoint_dir configured: starting from scratch")
    head, _, records = listing.partition("\n")
    if head.strip() == "missing":
        return Choice(why=f"checkpoint_dir {target.checkpoint_dir} does not exist: starting from scratch")
    refused = {(int(m), name) for m, _, name in (r[2:].partition(" ") for r in records.split("\0") if r.startswith("S ")) if m.isdigit()}
    return choose(parse_listing(records), refused=refused, before_step=before_step)


def describe(choice: Choice) -> str:
    skipped = f"; skipped {len(choice.skipped)}: " + ", ".join(choice.skipped[:5]) if choice.skipped else ""
    return (f"{choice.name}: " if choice.name else "") + choice.why + skipped


@step_task("launch")
def launch(
    target: Target, attempt: int, before_step: int | None = None, refuse: str | None = None, run_id: str | None = None
) -> tuple[LaunchDetail, StepRecord]:
    """Launch from the newest usable checkpoint; `before_step` and `refuse` rule out ones the last failure makes suspect.

    `run_id` is fixed by the caller so that a retry after a dropped connection names the same run: the host
    then adopts the trainer the first try started instead of refusing, or starting, a second one.
    """
    run_id = run_id or new_run_id(attempt)
    with timed() as clock:
        listing = plan_list_checkpoints(target, refuse)
        choice = pick_checkpoint(target, execute(target, listing).stdout if listing else None, before_step)
        if choice.name is None and target.checkpoint_dir:
            log().warning("%s: %s", target.name, describe(choice))
        checkpoint = f"{target.checkpoint_dir}/{choice.name}" if choice.name else None
        command, text = plan_launch(target, run_id, checkpoint)
        out = execute(
            target, command, advice="another trainer may be running, a venv or cache is half-built, or tmux failed: see the output"
        ).stdout.split()
        pid = int(out[0]) if out and out[0].isdigit() else None
        adopted = "adopted" in out
        if adopted:
            log().warning(
                "%s: the connection dropped during launch; run %s (PID %s) had started: adopted, not launched again",
                target.name,
                run_id,
                pid,
            )
        detail = LaunchDetail(
            run_id=run_id,
            log_path=log_path(target, run_id),
            pid=pid,
            checkpoint=checkpoint,
            checkpoint_why=describe(choice),
            command=text,
            adopted=adopted,
        )
    return detail, StepRecord(step=Step.LAUNCH, seconds=clock.seconds, detail=detail)
