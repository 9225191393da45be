"""One recovery per target at a time, even without a server: a lock folder on the host itself.

mkdir is atomic on every filesystem we meet. The owner file says who holds the lock; a lock whose
owner process is gone (same machine) or whose heartbeat is older than the stale limit is taken over.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from relaunch.commands import Command, script
from relaunch.config import Target
from relaunch.errors import HostBusy
from tasks.common import execute, log

STALE_SECONDS = 600
HEARTBEAT_SECONDS = 60

ACQUIRE = r"""
lock=$1 owner=$2 me=$3 stale=$4
mkdir -p "$(dirname "$lock")"
if ! mkdir "$lock" 2>/dev/null; then
  read -r host pid rest < "$lock/owner" 2>/dev/null
  age=$(( $(date +%s) - $(stat -c %Y "$lock/owner" 2>/dev/null || echo 0) ))
  if [ "$host" = "$me" ] && [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
    echo "taking over lock of dead orchestrator $host:$pid"
  elif [ "$age" -gt "$stale" ]; then
    echo "taking over lock with a heartbeat ${age}s old"
  else
    echo "held by: $(cat "$lock/owner" 2>/dev/null) (heartbeat ${age}s ago)"; exit 9
  fi
fi
printf '%s\n' "$owner" > "$lock/owner"
echo acquired
"""

RELEASE = r"""
lock=$1 owner=$2
[ "$(cat "$lock/owner" 2>/dev/null)" = "$owner" ] && rm -rf -- "$lock"
true
"""


def lock_path(target: Target) -> str:
    return f"{target.state_path}/lock.d"


def owner_line(flow_run: str = "") -> str:
    return f"{socket.gethostname()} {os.getpid()} {flow_run or '-'}"


def plan_acquire(target: Target, owner: str) -> Command:
    return script(ACQUIRE, lock_path(target), owner, socket.gethostname(), str(STALE_SECONDS), label="take the target lock")


@contextmanager
def target_lock(target: Target, flow_run: str = "") -> Iterator[None]:
    owner = owner_line(flow_run)
    result = execute(target, plan_acquire(target, owner), check=False)
    if result.exit_code != 0:
        raise HostBusy(f"on {target.host.label}: another recovery of {target.name} is running ({result.stdout.strip()}); wait for it, or remove {lock_path(target)} if you are sure it is dead")
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
