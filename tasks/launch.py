"""Step 6: start the trainer detached in tmux through generated launcher scripts; resume from the newest checkpoint."""

from __future__ import annotations

from pydantic import BaseModel

from relaunch.commands import Command, script
from relaunch.config import Target
from relaunch.hostscripts import LAUNCH
from relaunch.runfiles import launcher_script, log_path, new_run_id, supervisor_script, trainer_command
from tasks.common import StepRecord, execute, step_task, timed

PID_WAIT_SECONDS = 30

# Newest checkpoint: highest number in its name, then newest mtime. Nothing in the folder is touched.
NEWEST_CHECKPOINT = r"""
dir=$1
[ -d "$dir" ] || exit 0
find "$dir" -mindepth 1 -maxdepth 1 ! -name '.*' ! -name '*.tmp' -printf '%T@ %f\n' | while read -r t name; do
  n=$(grep -oE '[0-9]+' <<< "$name" | tail -n 1); printf '%020d %s %s\n' "${n:-0}" "$t" "$name"
done | sort | tail -n 1 | cut -d' ' -f3-
"""


class RunRecord(BaseModel):
    run_id: str
    log_path: str
    pid: int | None
    checkpoint: str | None
    command: str


def plan_find_checkpoint(target: Target) -> Command | None:
    if not target.checkpoint_dir:
        return None
    return script(NEWEST_CHECKPOINT, target.checkpoint_dir, label="find newest checkpoint")


def plan_launch(target: Target, run_id: str, checkpoint: str | None) -> tuple[Command, str]:
    command = trainer_command(target, checkpoint)
    launch = script(
        LAUNCH,
        target.state_path,
        target.tmux_session,
        run_id,
        log_path(target, run_id),
        supervisor_script(target, run_id, command),
        launcher_script(target, run_id),
        str(PID_WAIT_SECONDS),
        label="launch trainer in tmux",
        timeout_seconds=PID_WAIT_SECONDS + 30,
    )
    return launch, command


@step_task("launch")
def launch(target: Target, attempt: int) -> tuple[RunRecord, StepRecord]:
    with timed("launch") as detail:
        find = plan_find_checkpoint(target)
        name = execute(target, find).stdout.strip() if find else ""
        checkpoint = f"{target.checkpoint_dir}/{name}" if name else None
        run_id = new_run_id(attempt)
        command, text = plan_launch(target, run_id, checkpoint)
        out = execute(target, command, advice="another trainer may be running, or tmux failed: see the output").stdout.split()
        record = RunRecord(run_id=run_id, log_path=log_path(target, run_id), pid=int(out[0]) if out and out[0].isdigit() else None, checkpoint=checkpoint, command=text)
        detail.update(record.model_dump())
    return record, StepRecord(step="launch", seconds=detail.pop("seconds"), detail=detail)
