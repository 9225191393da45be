"""The run folder on a host, named once for Python (relaunch/host/lib.sh names it for bash).

STATE/current holds the run id of the current attempt; STATE/runs/ID/ holds that attempt's records.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

from relaunch.config import Target

CURRENT = "current"
RUNS = "runs"
PID = "pid"  # "PID STARTTIME" of the trainer
SUPERVISOR_PID = "supervisor_pid"  # "PID STARTTIME" of its supervisor, leader of its process group
EXIT_CODE = "exit_code"  # written when the trainer exits
LOG_PATH = "log_path"
STARTED_AT = "started_at"
CHECKPOINT = "checkpoint"
SPEC = "spec"


def current_file(state: str) -> str:
    return f"{state}/{CURRENT}"


def runs_folder(state: str) -> str:
    return f"{state}/{RUNS}"


def run_folder(state: str, run_id: str) -> str:
    return f"{state}/{RUNS}/{run_id}"


def record(state: str, run_id: str, name: str) -> str:
    return f"{run_folder(state, run_id)}/{name}"


def utc_stamp(now: datetime | None = None) -> str:
    """Sortable, and unique enough for names made in one recovery (microseconds)."""
    return (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S.%fZ")


def new_run_id(attempt: int, now: datetime | None = None, stamp: str | None = None) -> str:
    return f"{stamp or utc_stamp(now)}-a{attempt}"


def run_dir(target: Target, run_id: str) -> str:
    return run_folder(target.state_path, run_id)


def log_path(target: Target, run_id: str) -> str:
    return f"{target.log_dir}/{target.name}-{run_id}.log"


def state_identity(target: Target) -> str:
    """Who owns a state folder (STATE/target, lib.sh claim_state): one line, the same for a launch, an adoption,
    a poll and a stop."""
    return f"{target.name} {target.repo_dir} {target.tmux_session}"


def new_nonce() -> str:
    return secrets.token_hex(8)
