"""The host command of the preflight (relaunch/host/preflight.sh) and the reading of its problems; pure, no Prefect."""

from __future__ import annotations

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.wire.commands import Command, script

PREFLIGHT = host_script("preflight")


def plan_preflight(target: Target) -> Command:
    min_kb = str(int(target.min_free_disk_gb * 1024 * 1024))
    need_gpu = "1" if target.thresholds.expected_gpus else "0"
    return script(
        PREFLIGHT,
        target.repo_dir,
        target.known_good_ref,
        target.lock_path,
        target.venv_dir,
        min_kb,
        target.log_dir,
        need_gpu,
        target.python,
        label="preflight",
        timeout_seconds=60,
    )


def problems_in(stdout: str) -> list[str]:
    return [line.removeprefix("PROBLEM: ") for line in stdout.splitlines() if line.startswith("PROBLEM: ")]
