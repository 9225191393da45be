"""Undo a venv rebuild with one command: the current venv goes aside, the newest one rebuild_venv kept comes back.

Nothing is deleted: the venv being replaced is kept as `VENV.rolled-back-STAMP`. Only `VENV.old-*` (complete
venvs that rebuild_venv moved aside) are candidates; a half-built `.incomplete-*` or a `.failed-*` never is.
"""

from __future__ import annotations

from relaunch.config import Target
from relaunch.plans.rollback_venv import parse_rollback, plan_rollback
from relaunch.runlayout import utc_stamp
from relaunch.steps import RollbackDetail, StepRecord
from relaunch.tasks.common import execute, log, step_task, timed
from relaunch.tasks.lock import target_lock
from relaunch.vocabulary import Step


@step_task("rollback_venv")
def rollback_venv(target: Target) -> StepRecord:
    """Put the previous venv back (under the target lock, so never during a recovery); keep the current one aside."""
    detail = RollbackDetail()
    with timed() as clock, target_lock(target, "rollback-venv"):
        out = execute(
            target,
            plan_rollback(target, utc_stamp()),
            advice="see the output: stop the trainer first, or there is no previous venv kept aside",
        ).stdout
        detail = RollbackDetail(**parse_rollback(out))
        log().warning(
            "venv %s rolled back to %s; the replaced one is kept as %s", target.venv_dir, detail.restored_from, detail.rolled_back_to
        )
    return StepRecord(step=Step.ROLLBACK_VENV, seconds=clock.seconds, detail=detail)
