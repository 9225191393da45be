"""Where tracked host commands record themselves (STATE/inflight), and the command that stops the leftovers; pure, no Prefect."""

from __future__ import annotations

from dataclasses import replace

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.wire.commands import Command, script

REAP = host_script("reap_leftovers")


def inflight_dir(target: Target) -> str:
    return f"{target.state_path}/inflight"


def tracked(target: Target, command: Command) -> Command:
    """The same command, recorded on the host while it runs."""
    return replace(command, track_in=inflight_dir(target))


def plan_reap(target: Target, timeout_seconds: int = 20) -> Command:
    return script(
        REAP,
        inflight_dir(target),
        str(timeout_seconds),
        label="stop leftovers of a killed recovery",
        timeout_seconds=timeout_seconds * 4 + 30,
    )
