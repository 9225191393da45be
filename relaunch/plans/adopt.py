"""The host command of an adoption (relaunch/host/adopt.sh) and the reading of what it prints; pure, no Prefect."""

from __future__ import annotations

from pydantic import BaseModel, Field

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.runlayout import state_identity
from relaunch.wire.commands import Command, script

ADOPT = host_script("adopt")
LOCK_WAIT_SECONDS = 30


class Adoption(BaseModel):
    run_id: str = Field(description="The run folder now current: STATE/runs/<stamp>-adopted.")
    pid: int = Field(description="The adopted trainer: the pane's process, or what an interactive shell started.")
    pane_id: str = Field("", description="The tmux pane (`%N`) it runs in.")
    how: str = Field(
        description="How its log was found: `tee` (a tee's file), `stdout` (its standard output), `open` (a file it "
        "holds open for writing in log_dir), `--log` (named)."
    )
    log_path: str
    command: str = Field("", description="The trainer's command line.")


def plan_adopt(target: Target, run_id: str, log_file: str | None = None) -> Command:
    return script(
        ADOPT,
        target.state_path,
        target.tmux_session,
        log_file or "",
        state_identity(target),
        run_id,
        str(LOCK_WAIT_SECONDS),
        target.log_dir,
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
