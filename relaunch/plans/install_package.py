"""The host command of the missing-dependency remedy: `uv pip install` of one package into the venv; pure, no Prefect."""

from __future__ import annotations

from relaunch.commands import Command
from relaunch.config import Target
from relaunch.plans.leftovers import tracked
from relaunch.plans.rebuild_venv import installer_flags


def plan_install(target: Target, package: str) -> Command:
    py = f"{target.venv_dir}/bin/python"
    return tracked(
        target,
        Command(
            ("uv", "pip", "install", "--python", py, "--compile-bytecode", *installer_flags(target), package),
            label=f"uv pip install {package}",
            timeout_seconds=1800,
        ),
    )
