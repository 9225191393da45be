"""Step 1: find every reason the recovery would fail, before anything is changed."""

from __future__ import annotations

from relaunch.commands import Command, script
from relaunch.config import Target
from relaunch.errors import PreflightFailed
from relaunch.host import host_script
from relaunch.steps import PreflightDetail, Step, StepRecord
from relaunch.tasks.common import execute, step_task, timed

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


@step_task("preflight")
def preflight(target: Target) -> StepRecord:
    with timed() as clock:
        result = execute(target, plan_preflight(target))
        problems = problems_in(result.stdout)
        if problems:
            raise PreflightFailed(target.host.label, problems)
    return StepRecord(step=Step.PREFLIGHT, seconds=clock.seconds, detail=PreflightDetail())
