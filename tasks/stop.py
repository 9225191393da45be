"""Step 2: stop what relaunch started or adopted for the target (one SIGTERM each, the target's grace, then
SIGKILL), its own tmux pane only; bounded wait for GPU release. A person's stop is recorded (STATE/stopped)."""

from __future__ import annotations

from relaunch.config import Target
from relaunch.plans.stop import parse_stop, plan_stop
from relaunch.steps import StepRecord
from relaunch.tasks.common import execute, step_task, timed
from relaunch.vocabulary import Step


@step_task("stop")
def stop(target: Target, deliberate: bool = False) -> StepRecord:
    """A recovery's stop (deliberate=False) leaves no mark; a person's (`relaunch stop`) marks the target stopped."""
    with timed() as clock:
        result = execute(
            target,
            plan_stop(target, deliberate=deliberate),
            advice="stop the trainer by hand (kill its recorded PID: STATE/runs/ID/pid; close its pane) and run again",
        )
        detail = parse_stop(result.stdout, deliberate)
    return StepRecord(step=Step.STOP, seconds=clock.seconds, detail=detail)
