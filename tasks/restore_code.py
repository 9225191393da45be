"""Step 4: save what the restore would drop as a patch, then restore the paths to the known-good ref.

A repo in the middle of a rebase, merge, cherry-pick, revert or `git am` is refused, named (which operation,
which files conflict), with what to do: checking the paths out would silently reset a conflicted file to the
ref. `check_restorable` asks the same question without writing anything, so a recovery can ask it before
it stops the run.
"""

from __future__ import annotations

from relaunch.config import Target
from relaunch.plans.restore_code import plan_restore
from relaunch.steps import RestoreDetail, StepRecord
from relaunch.tasks.common import execute, step_task, timed
from relaunch.vocabulary import Step

ADVICE = "see the output: finish or abort the git operation in progress (or resolve the conflicts), or check the repo; nothing was restored"


def check_restorable(target: Target) -> None:
    """Raise CommandFailed (exit 40, the operation and conflicted files named) when restore_code would refuse; reads only."""
    if target.restore_paths:
        execute(target, plan_restore(target, check_only=True), advice=ADVICE)


@step_task("restore_code")
def restore_code(target: Target) -> StepRecord:
    detail = RestoreDetail()
    with timed() as clock:
        if not target.restore_paths:
            detail.skipped = "no restore_paths configured"
        else:
            out = execute(target, plan_restore(target), advice=ADVICE).stdout
            fields = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
            detail = RestoreDetail(commit=fields.get("ref"), head=fields.get("head"), patch=fields.get("saved"), paths=target.restore_paths)
    return StepRecord(step=Step.RESTORE_CODE, seconds=clock.seconds, detail=detail)
