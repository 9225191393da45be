"""The host command that takes the target's lock folder (relaunch/host/lock_acquire.sh); pure, no Prefect."""

from __future__ import annotations

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.wire.commands import Command, script

STALE_SECONDS = 600

# Prints "acquired", or "held: OWNER LINE" and the heartbeat age with exit 9. Taking over is decided
# under flock, so racing recoveries cannot both win: a stale heartbeat, or exactly the owner line the
# orchestrator found dead (only it can check its own machine's PIDs).
ACQUIRE = host_script("lock_acquire")


def lock_path(target: Target) -> str:
    return f"{target.state_path}/lock.d"


def plan_acquire(target: Target, owner: str, dead_owner: str = "") -> Command:
    return script(ACQUIRE, lock_path(target), owner, str(STALE_SECONDS), dead_owner, label="take the target lock")
