"""The host command of the code restore (relaunch/host/restore.sh); pure, no Prefect."""

from __future__ import annotations

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.runlayout import utc_stamp
from relaunch.wire.commands import Command, script

RESTORE = host_script("restore")
# restore.sh's exit when the repo is mid-operation or holds unmerged files.
MID_OPERATION_EXIT = 40


def plan_restore(target: Target, stamp: str | None = None, check_only: bool = False) -> Command:
    stamp = stamp or utc_stamp()
    patch = f"{target.state_path}/patches/{stamp}-restore.patch"
    return script(
        RESTORE,
        "check" if check_only else "restore",
        target.repo_dir,
        target.known_good_ref,
        patch,
        *target.restore_paths,
        label="check the repo can be restored" if check_only else "git restore",
        timeout_seconds=120,
    )
