"""Undo a venv rebuild with one command: the current venv goes aside, the newest one rebuild_venv kept comes back.

Nothing is deleted: the venv being replaced is kept as `VENV.rolled-back-STAMP`. Only `VENV.old-*` (complete
venvs that rebuild_venv moved aside) are candidates; a half-built `.incomplete-*` or a `.failed-*` never is.
"""

from __future__ import annotations

from relaunch.commands import Command, script
from relaunch.config import Target
from relaunch.host import host_script
from relaunch.runfiles import utc_stamp
from relaunch.steps import RollbackDetail, StepRecord
from relaunch.tasks.common import execute, log, step_task, timed
from relaunch.tasks.lock import target_lock
from relaunch.vocabulary import Step

# Refuse under a live trainer (it has the venv's files open); otherwise swap, putting the current one back on failure.
ROLLBACK = host_script("rollback_venv")


def plan_rollback(target: Target, stamp: str) -> Command:
    """The one host command of a rollback; every value reaches the script as a positional argument."""
    return script(ROLLBACK, target.venv_dir, stamp, target.state_path, label="roll the venv back", timeout_seconds=300)


def parse_rollback(stdout: str) -> dict[str, str | None]:
    fields = dict(line.split(" ", 1) for line in stdout.splitlines() if line.startswith(("kept ", "restored ")))
    return {"restored_from": fields.get("restored"), "rolled_back_to": fields.get("kept")}


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
