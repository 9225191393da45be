"""The host command of the missing-dependency remedy: one package into the venv, its other packages kept as they are
(relaunch/host/install_package.sh); pure, no Prefect."""

from __future__ import annotations

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.plans.leftovers import tracked
from relaunch.plans.rebuild_venv import installer_flags
from relaunch.wire.commands import Command, script


def plan_install(target: Target, package: str) -> Command:
    return tracked(
        target,
        script(
            host_script("install_package"),
            f"{target.venv_dir}/bin/python",
            package,
            target.lock_path,
            *installer_flags(target),
            label=f"uv pip install {package}",
            timeout_seconds=1800,
        ),
    )


def parse_added(stdout: str) -> list[str]:
    """The `NAME==VERSION` of each distribution the install added, as the host script printed them."""
    return [line.removeprefix("added ").strip() for line in stdout.splitlines() if line.startswith("added ")]
