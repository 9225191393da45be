"""The run folder on a host, named once for Python (relaunch/host/lib.sh names it for bash).

STATE/current holds the run id of the current attempt; STATE/runs/ID/ holds that attempt's records.
"""

from __future__ import annotations

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
