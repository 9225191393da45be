"""Step 4: save what the restore would drop as a patch, then restore the paths to the known-good ref."""

from __future__ import annotations

from relaunch.commands import Command, script
from relaunch.config import Target
from relaunch.host import host_script
from relaunch.runfiles import utc_stamp
from relaunch.steps import RestoreDetail, Step, StepRecord
from tasks.common import execute, step_task, timed

RESTORE = host_script("restore")


def plan_restore(target: Target, stamp: str | None = None) -> Command:
    stamp = stamp or utc_stamp()
    patch = f"{target.state_path}/patches/{stamp}-restore.patch"
    return script(RESTORE, target.repo_dir, target.known_good_ref, patch, *target.restore_paths, label="git restore", timeout_seconds=120)


@step_task("restore_code")
def restore_code(target: Target) -> StepRecord:
    detail = RestoreDetail()
    with timed() as clock:
        if not target.restore_paths:
            detail.skipped = "no restore_paths configured"
        else:
            out = execute(target, plan_restore(target), advice="check the repo on the host; nothing was restored").stdout
            fields = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
            detail = RestoreDetail(commit=fields.get("ref"), head=fields.get("head"), patch=fields.get("saved"), paths=target.restore_paths)
    return StepRecord(step=Step.RESTORE_CODE, seconds=clock.seconds, detail=detail)
