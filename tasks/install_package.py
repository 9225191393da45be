"""Remedy for a missing dependency: install the named package into the venv, with the target's indexes."""

from __future__ import annotations

from relaunch.config import Target
from relaunch.plans.install_package import parse_added, plan_install
from relaunch.steps import InstallDetail, StepRecord
from relaunch.tasks.common import execute, log, step_task, timed
from relaunch.tasks.leftovers import stop_earlier_try
from relaunch.vocabulary import Step


@step_task("install_package")
def install_package(target: Target, package: str) -> StepRecord:
    stop_earlier_try(target)
    with timed() as clock:
        done = execute(
            target,
            plan_install(target, package),
            advice=f"{package} is not installable from the configured indexes without changing the venv's other packages: "
            "add it (and what it needs) to the lock at versions that fit, then recover again; or add an index or find-links, or fix the name",
        )
        added = parse_added(done.stdout)
        detail = InstallDetail(package=package, added=added, output=done.stderr.strip().splitlines()[-3:])
        log().warning(
            "installed %s into %s; add %s to %s so the next rebuild keeps %s",
            package,
            target.venv_dir,
            ", ".join(added) or package,
            target.lock_file,
            "them" if len(added) > 1 else "it",
        )
    return StepRecord(step=Step.INSTALL_PACKAGE, seconds=clock.seconds, detail=detail)
