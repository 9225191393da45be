"""The host command of a venv rollback (relaunch/host/rollback_venv.sh) and the reading of its output; pure, no Prefect."""

from __future__ import annotations

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.wire.commands import Command, script

# Refuse under a live trainer (it has the venv's files open); otherwise swap, putting the current one back on failure.
ROLLBACK = host_script("rollback_venv")


def plan_rollback(target: Target, stamp: str) -> Command:
    """The one host command of a rollback; every value reaches the script as a positional argument."""
    return script(ROLLBACK, target.venv_dir, stamp, target.state_path, label="roll the venv back", timeout_seconds=300)


def parse_rollback(stdout: str) -> dict[str, str | None]:
    fields = dict(line.split(" ", 1) for line in stdout.splitlines() if line.startswith(("kept ", "restored ")))
    return {"restored_from": fields.get("restored"), "rolled_back_to": fields.get("kept")}
