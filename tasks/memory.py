"""Memory across nights, kept in Prefect Variables: every worker of a scale-out reads the same, and no database is added.

One Variable per target (`relaunch-history-...`: its nights, relaunch/deciding/history.py) and one per host
(`relaunch-gpus-...`: its GPU ledger, relaunch/deciding/ledger.py). Why Variables and not flow runs or artifacts found by
tag: a Variable is one small JSON document read by name in one request, and a person can clear an entry of it in
place; reading the nights back out of old runs' artifacts would page through every run of the target and parse
markdown written for people. Writes are safe without a transaction: a target's history is written under its lock
(one recovery of a target at a time), and the ledger is read again just before it is written, so a concurrent
`relaunch gpus clear` or another target's fault on the same host is merged, not overwritten.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from relaunch.config import Target
from relaunch.deciding.history import History, Night
from relaunch.deciding.ledger import GpuFault, Ledger

LEDGER_TAG = "relaunch-gpu-ledger"
HISTORY_TAG = "relaunch-history"


class Memory(BaseModel):
    history: History
    ledger: Ledger


def variable_name(kind: str, name: str, identity: str | None = None) -> str:
    """Variable names take lowercase letters, digits, dashes and underscores only: the name made so, plus a short hash
    of what it stands for as given (`Gpu.Host` and `gpu-host` stay apart)."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")[:120]
    return f"relaunch-{kind}-{slug}-{hashlib.sha256((identity or name).encode()).hexdigest()[:8]}"


def history_variable(target: Target) -> str:
    """One run's history: the fleet's own idea of one run (flows/fleet.py) is its host and its state folder, so two
    targets of one name on two hosts keep two histories."""
    return variable_name("history", target.name, f"{target.name} {target.host.label} {target.state_path}")


def ledger_variable(hostname: str) -> str:
    return variable_name("gpus", hostname)


def _read(client: Any, name: str) -> Any:
    variable = client.read_variable_by_name(name)
    return variable.value if variable is not None else None


def _write(client: Any, name: str, value: dict[str, Any], tag: str) -> None:
    from prefect.client.schemas.actions import VariableCreate, VariableUpdate

    if client.read_variable_by_name(name) is None:
        client.create_variable(VariableCreate(name=name, value=value, tags=[tag]))
    else:
        client.update_variable(VariableUpdate(name=name, value=value, tags=[tag]))


def read_ledger(client: Any, hostname: str) -> Ledger:
    value = _read(client, ledger_variable(hostname))
    return Ledger.model_validate(value) if value else Ledger(host=hostname)


def write_ledger(client: Any, ledger: Ledger) -> None:
    _write(client, ledger_variable(ledger.host), ledger.model_dump(mode="json"), LEDGER_TAG)


def all_ledgers(client: Any) -> list[Ledger]:
    """Every host's ledger on the server, by the tag each ledger Variable carries."""
    response = client.request("POST", "/variables/filter", json={"variables": {"tags": {"all_": [LEDGER_TAG]}}, "limit": 200})
    response.raise_for_status()
    return sorted((Ledger.model_validate(v["value"]) for v in response.json() if v.get("value")), key=lambda ledger: ledger.host)


@task(name="recall", task_run_name="recall@{target.name}", retries=2, retry_delay_seconds=[2, 10], cache_policy=NO_CACHE)
def recall(target: Target) -> Memory:
    """The target's nights and its host's GPU ledger, as the last recoveries left them."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        value = _read(client, history_variable(target))
        history = History.model_validate(value) if value else History(target=target.name)
        return Memory(history=history, ledger=read_ledger(client, target.host.hostname))


@task(name="remember", task_run_name="remember@{target.name}", retries=2, retry_delay_seconds=[2, 10], cache_policy=NO_CACHE)
def remember(target: Target, night: Night, faults: list[GpuFault], at: datetime) -> Memory:
    """This night added to the target's history, and the GPUs it found failed to its host's ledger."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        value = _read(client, history_variable(target))
        history = (History.model_validate(value) if value else History(target=target.name)).with_night(night)
        _write(client, history_variable(target), history.model_dump(mode="json"), HISTORY_TAG)
        ledger = read_ledger(client, target.host.hostname)
        if faults:
            ledger = ledger.with_faults(faults, at, target.name, night.flow_run)
            write_ledger(client, ledger)
        return Memory(history=history, ledger=ledger)


WATCH_TAG = "relaunch-watch"


def watch_variable(target: Target) -> str:
    """The run whose death a watch last handed over, per run as its history is (host and state folder)."""
    return variable_name("watch", target.name, f"{target.name} {target.host.label} {target.state_path}")


def read_handed(target: Target) -> str | None:
    """The run id a watch last handed to recover-training: a watch restarted (a service, the next scheduled run of the
    watch deployment) does not hand the same death over again."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        value = _read(client, watch_variable(target))
    return value.get("run_id") if isinstance(value, dict) else None


def write_handed(target: Target, run_id: str) -> None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        _write(client, watch_variable(target), {"target": target.name, "run_id": run_id}, WATCH_TAG)


def paused_variable(target: Target) -> str:
    """The run whose pause (verdict paused: a person's SIGSTOP, Ctrl-Z, a debugger) was last told, per run as the watch's."""
    return variable_name("paused", target.name, f"{target.name} {target.host.label} {target.state_path}")


def first_told_pause(target: Target, run_id: str) -> bool:
    """Whether the pause of `run_id` is told now: True the first time, and recorded, so every later check of the same
    pause is quiet (a pause lasts nights; a person is told once, not every night)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        value = _read(client, paused_variable(target))
        if isinstance(value, dict) and value.get("run_id") == run_id:
            return False
        _write(client, paused_variable(target), {"target": target.name, "run_id": run_id}, WATCH_TAG)
    return True
