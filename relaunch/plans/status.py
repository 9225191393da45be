"""What `relaunch status` reads on a host, and its parsers; pure, no Prefect.

The run as it is now comes from the watch's look (relaunch/host/pulse.sh, parsed by relaunch.plans.watch.parse_pulse),
not held and starting nothing on the host; a trainer that is gone with its exit recorded is dated by the exit record's
own time (one `stat`, only then). A live run is dated by its run id, the moment it was launched or adopted.
"""

from __future__ import annotations

from datetime import UTC, datetime

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.runlayout import EXIT_CODE, record, state_identity
from relaunch.wire.commands import Command, script

LOOK_TIMEOUT_SECONDS = 30


def plan_look(target: Target) -> Command:
    """The watch's look, as status takes it: held for no time (hold 0) and starting no progress recorder (sample 0):
    status changes nothing on the host. pulse.sh's arguments: STATE IDENTITY HOLD_MS RECORD_S."""
    return script(
        host_script("pulse"), target.state_path, state_identity(target), "0", "0", label="status look", timeout_seconds=LOOK_TIMEOUT_SECONDS
    )


def plan_exit_time(target: Target, run_id: str) -> Command:
    """When the run's exit record was written (its mtime, epoch seconds on the host's clock): when the trainer died."""
    path = record(target.state_path, run_id, EXIT_CODE)
    return Command(argv=("stat", "-c", "%Y", "--", path), label="exit record's time", timeout_seconds=LOOK_TIMEOUT_SECONDS)


def parse_exit_time(stdout: str) -> datetime | None:
    """`stat -c %Y`'s answer as a UTC time; None for anything else (no such file, a stat without -c)."""
    text = stdout.strip()
    if not text.isdigit():
        return None
    return datetime.fromtimestamp(int(text), UTC)


def launched_at(run_id: str | None) -> datetime | None:
    """When a run was launched or adopted, from its id (runlayout.new_run_id: `20261206T043017.256116Z-a1`)."""
    stamp = (run_id or "").split("-", 1)[0]
    try:
        return datetime.strptime(stamp, "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=UTC)
    except ValueError:
        return None
