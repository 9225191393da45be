"""Remedy for a missing dependency: install the named package into the venv, with the target's indexes."""

from __future__ import annotations

from relaunch.config import Target
from relaunch.plans.install_package import plan_install
from relaunch.steps import InstallDetail, StepRecord
from relaunch.tasks.common import execute, log, step_task, timed
from relaunch.tasks.leftovers import stop_earlier_try
from relaunch.vocabulary import Step


@step_task("install_package")
def install_package(target: Target, package: str) -> StepRecord:
    stop_earlier_try(target)
    with timed() as clock:
        out = execute(
            target,
            plan_install(target, package),
            advice=f"{package} is not installable from the configured indexes; add an index or find-links, or fix the name",
        ).stderr
        detail = InstallDetail(package=package, output=out.strip().splitlines()[-3:])
        log().warning("installed %s into %s; add it to %s so the next rebuild keeps it", package, target.venv_dir, target.lock_file)
    return StepRecord(step=Step.INSTALL_PACKAGE, seconds=clock.seconds, detail=detail)
