"""Before a recovery acts: stop host commands that a killed orchestrator left running.

A SIGKILLed worker cannot stop its host commands: each runs under `timeout`, which leads its own
process group, so a half-done `uv pip sync` or warm-up goes on writing into the venv or cache the
next recovery rebuilds. Tracked commands record PID, start time and group in `STATE/inflight/`;
under the target lock, every record whose PID is still alive with that start time is such a
leftover, and its whole group is stopped. Only recorded PIDs, never a name pattern.
"""

from __future__ import annotations

from prefect.context import TaskRunContext

from relaunch.config import Target
from relaunch.plans.leftovers import plan_reap
from relaunch.steps import LeftoversDetail, StepRecord
from relaunch.tasks.common import execute, log, step_task, timed
from relaunch.vocabulary import Step


def reap(target: Target) -> list[str]:
    """Stop every recorded host command still running; the lines saying what was stopped."""
    out = execute(target, plan_reap(target), advice="stop the listed PIDs by hand, then run again").stdout
    stopped = [line for line in out.splitlines() if line.startswith("stopping ")]
    for line in stopped:
        log().warning("%s", line)
    return stopped


@step_task("stop_leftovers")
def stop_leftovers(target: Target) -> StepRecord:
    detail = LeftoversDetail()
    with timed() as clock:
        detail.stopped = reap(target)
    return StepRecord(step=Step.STOP_LEFTOVERS, seconds=clock.seconds, detail=detail)


def is_retry() -> bool:
    """Whether this task run is a retry (Prefect retries a step only after a fault of the wire)."""
    ctx = TaskRunContext.get()
    return bool(ctx and ctx.task_run.run_count > 1)


def stop_earlier_try(target: Target) -> list[str]:
    """On a retry, first stop what the step's earlier try left running on the host.

    A dropped connection does not stop the host command it carried: a retried `uv pip sync` or warm-up would
    otherwise write into the venv or cache beside the first one. Under the target lock every live record is
    this recovery's own, so each is the earlier try's.
    """
    return reap(target) if is_retry() else []
