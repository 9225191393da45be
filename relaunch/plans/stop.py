"""The host command of a stop (relaunch/host/stop.sh) and the reading of its report; pure, no Prefect (`relaunch stop` uses it)."""

from __future__ import annotations

import re

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.runlayout import state_identity
from relaunch.steps import StopDetail
from relaunch.wire.commands import Command, script

# What stop.sh waits beyond the grace at most: SIGKILL's own wait, the log writer, the pane, the GPUs' release.
STOP_OVERHEAD_SECONDS = 90


def plan_stop(target: Target, grace_seconds: float | None = None, deliberate: bool = False) -> Command:
    """The host command of a stop. `grace_seconds` (tests) overrides the target's `stop_grace_seconds`;
    `deliberate` is a person's stop, recorded so that checks leave the target stopped."""
    grace = target.stop_grace_seconds if grace_seconds is None else grace_seconds
    return script(
        host_script("stop"),
        target.state_path,
        target.tmux_session,
        f"{grace:.3f}".rstrip("0").rstrip("."),  # plain decimal seconds: bash and awk read no exponent
        "deliberate" if deliberate else "recovery",
        state_identity(target),
        label="stop trainer",
        timeout_seconds=grace + STOP_OVERHEAD_SECONDS,
    )


# stop.sh's report lines (relaunch/host/stop.sh prints them): PIDs, each maybe followed by its role in brackets.
_TERM = re.compile(r"^sent SIGTERM to \d+ process\(es\)(?: born since)?: (?P<pids>.*)$|^sent SIGTERM to the log writer (?P<lw>\d+)$")
_KILL = re.compile(r"^still alive after .* s: sent SIGKILL to (?P<pids>.*)$|^sent SIGKILL to the log writer (?P<lw>\d+)$")
_SURVIVOR = re.compile(r"^could not stop (?P<pid>\d+) \((?P<command>.*)\): alive after SIGKILL$")
_PANES_LEFT = re.compile(r"^other panes of session \S+ left running: (?P<panes>.*)$")
_PID = re.compile(r"(?:^|\s)(\d+)(?=\s\(|\s|$)")


def _pids(match: re.Match[str] | None) -> list[int]:
    if match is None:
        return []
    if match.group("lw"):
        return [int(match.group("lw"))]
    # Roles are bracketed after each PID ("12 (trainer) 13 (child of 12)"): drop them, keep the PIDs.
    return [int(p) for p in _PID.findall(re.sub(r"\([^)]*\)", "", match.group("pids")))]


def parse_stop(output: str, deliberate: bool = False) -> StopDetail:
    """StopDetail from stop.sh's output."""
    lines = output.strip().splitlines()
    detail = StopDetail(output=lines[-20:], deliberate=deliberate)
    for line in lines:
        detail.signalled += _pids(_TERM.match(line))
        detail.killed += _pids(_KILL.match(line))
        if survivor := _SURVIVOR.match(line):
            detail.survivors.append(f"{survivor['pid']} {survivor['command']}")
        if panes := _PANES_LEFT.match(line):
            detail.panes_left += re.findall(r"%\d+ \(PID \d+: [^)]*\)", panes["panes"])
    return detail
