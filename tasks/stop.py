"""Step 2: stop the recorded trainer and the configured tmux session; bounded wait for exit and GPU release."""

from __future__ import annotations

from relaunch.commands import Command, script
from relaunch.config import Target
from relaunch.host import host_script
from relaunch.steps import Step, StepRecord, StopDetail
from tasks.common import execute, step_task, timed

STOP_TIMEOUT_SECONDS = 60


def plan_stop(target: Target, timeout_seconds: int = STOP_TIMEOUT_SECONDS) -> Command:
    return script(
        host_script("stop"),
        target.state_path,
        target.tmux_session,
        str(timeout_seconds),
        label="stop trainer",
        timeout_seconds=timeout_seconds + 90,
    )


@step_task("stop")
def stop(target: Target) -> StepRecord:
    detail = StopDetail()
    with timed() as clock:
        result = execute(target, plan_stop(target), advice="stop the trainer by hand (tmux kill-session; kill its PID) and run again")
        detail.output = result.stdout.strip().splitlines()[-3:]
    return StepRecord(step=Step.STOP, seconds=clock.seconds, detail=detail)
