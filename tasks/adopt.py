"""Adopt a run a person started in the target's tmux session: record it as the current run, signal nothing.

From then on the health poll judges it by the same rules as relaunch's own runs, and stops and recoveries
treat it as theirs (its pane, its PIDs with start times, its log). Refused, naming why, when the session is
missing or is relaunch's own run, when the state folder belongs to another target, when a trainer of this
target is alive elsewhere, or when no log can be found and none was named.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from relaunch.commands import Command, script
from relaunch.config import Target
from relaunch.host import host_script
from relaunch.runfiles import state_identity, utc_stamp
from relaunch.tasks.common import execute, log, step_task

ADOPT = host_script("adopt")
LOCK_WAIT_SECONDS = 30


class Adoption(BaseModel):
    run_id: str = Field(description="The run folder now current: STATE/runs/<stamp>-adopted.")
    pid: int = Field(description="The adopted trainer: the pane's process, or what an interactive shell started.")
    pane_id: str = Field("", description="The tmux pane (`%N`) it runs in.")
    how: str = Field(description="How its log was found: `tee` (a tee's file), `stdout` (its standard output), `--log` (named).")
    log_path: str
    command: str = Field("", description="The trainer's command line.")


def new_adopted_run_id() -> str:
    return f"{utc_stamp()}-adopted"


def plan_adopt(target: Target, run_id: str, log_file: str | None = None) -> Command:
    return script(
        ADOPT,
        target.state_path,
        target.tmux_session,
        log_file or "",
        state_identity(target),
        run_id,
        str(LOCK_WAIT_SECONDS),
        label="adopt the run in tmux",
        timeout_seconds=LOCK_WAIT_SECONDS + 60,
    )


def parse_adoption(stdout: str) -> Adoption:
    """The `KEY VALUE` lines adopt.sh prints last (the log path and command may hold spaces)."""
    fields = dict(line.partition(" ")[::2] for line in stdout.splitlines() if line)
    return Adoption(
        run_id=fields["adopted"],
        pid=int(fields["pid"]),
        pane_id=fields.get("pane", ""),
        how=fields["how"],
        log_path=fields["log"],
        command=fields.get("command", ""),
    )


def adopt_run(target: Target, log_file: str | None = None) -> Adoption:
    """One host command; a refusal raises CommandFailed with the host's reason (nothing was changed then)."""
    result = execute(
        target,
        plan_adopt(target, new_adopted_run_id(), log_file),
        advice="the output says why and what to do; nothing was changed and nothing was signalled",
    )
    adoption = parse_adoption(result.stdout)
    log().info(
        "%s: adopted the run in tmux session %s as %s: pid %s, log %s (found by %s)",
        target.name,
        target.tmux_session,
        adoption.run_id,
        adoption.pid,
        adoption.log_path,
        adoption.how,
    )
    return adoption


@step_task("adopt")
def adopt(target: Target, log_file: str | None = None) -> Adoption:
    return adopt_run(target, log_file)
