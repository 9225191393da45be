"""Step 1: find every reason the recovery would fail, before anything is changed."""

from __future__ import annotations

from relaunch.config import Target
from relaunch.errors import PreflightFailed
from relaunch.plans.preflight import plan_preflight, problems_in
from relaunch.steps import PreflightDetail, StepRecord
from relaunch.tasks.common import execute, step_task, timed
from relaunch.vocabulary import Step


@step_task("preflight")
def preflight(target: Target) -> StepRecord:
    with timed() as clock:
        result = execute(target, plan_preflight(target))
        problems = problems_in(result.stdout)
        if problems:
            raise PreflightFailed(target.host.label, problems)
    return StepRecord(step=Step.PREFLIGHT, seconds=clock.seconds, detail=PreflightDetail())
