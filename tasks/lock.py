"""One recovery per target at a time, even without a server: a lock folder on the host itself.

The owner file says who holds the lock (orchestrator host, PID, flow run). A lock whose owner
process is gone (checked by the orchestrator on its own machine) or whose heartbeat is older
than the stale limit is taken over, under flock so that only one racer wins.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from relaunch.config import Target
from relaunch.errors import HostBusy
from relaunch.host import host_script
from relaunch.plans.lock import lock_path, plan_acquire
from relaunch.tasks.common import execute, log
from relaunch.wire.commands import Command, script

HEARTBEAT_SECONDS = 60

RELEASE = host_script("lock_release")


def owner_line(flow_run: str = "") -> str:
    return f"{socket.gethostname()} {os.getpid()} {flow_run or '-'}"


def dead_local_owner(output: str) -> str:
    """The holder's owner line if it is an orchestrator on this machine whose PID is gone, else ''."""
    line = next((x.removeprefix("held: ") for x in output.splitlines() if x.startswith("held: ")), "")
    parts = line.split()
    if len(parts) < 2 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return ""
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return line
    except PermissionError:
        return ""
    return ""


@contextmanager
def target_lock(target: Target, flow_run: str = "") -> Iterator[None]:
    owner = owner_line(flow_run)
    result = execute(target, plan_acquire(target, owner), check=False)
    if result.exit_code == 9 and (dead := dead_local_owner(result.stdout)):
        result = execute(target, plan_acquire(target, owner, dead), check=False)
    if result.exit_code != 0:
        raise HostBusy(
            f"on {target.host.label}: another recovery of {target.name} is running ({' '.join(result.stdout.split())}); wait for it, or remove {lock_path(target)} if you are sure it is dead"
        )
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            execute(target, Command(("touch", f"{lock_path(target)}/owner"), label="lock heartbeat"), check=False)

    thread = threading.Thread(target=beat, daemon=True, name="relaunch-lock-heartbeat")
    thread.start()
    log().info("%s", result.stdout.strip().splitlines()[-1])
    try:
        yield
    finally:
        stop.set()
        execute(target, script(RELEASE, lock_path(target), owner, label="release the target lock"), check=False)
