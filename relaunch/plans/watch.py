"""The host command of the watch's look (relaunch/host/pulse.sh) and its parser; pure, no Prefect."""

from __future__ import annotations

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.judging.logtext import number_or_none
from relaunch.judging.watching import Pulse
from relaunch.plans.health import parse_progress
from relaunch.runlayout import state_identity
from relaunch.wire.commands import Command, script


def plan_pulse(target: Target, hold_seconds: float = 0.0) -> Command:
    """The host command of one look (relaunch/host/pulse.sh): a few file reads and two /proc reads. Held up to
    `hold_seconds` while the recorded trainer lives: it returns at once when the trainer dies."""
    return script(
        host_script("pulse"),
        target.state_path,
        state_identity(target),
        str(int(hold_seconds * 1000)),
        f"{target.thresholds.progress_sample_seconds:g}",
        label="watch look",
        timeout_seconds=30 + hold_seconds,
    )


def parse_pulse(stdout: str) -> Pulse:
    """`KEY VALUE` lines, then, for a live run, `progress` and its record's lines to the end."""
    fields: dict[str, str] = {}
    lines = stdout.splitlines()
    record = lines.index("progress") if "progress" in lines else len(lines)
    for line in lines[:record]:
        key, _, value = line.partition(" ")
        fields[key] = value.strip()
    return Pulse(
        run_id=fields.get("run_id") or None,
        pid=number_or_none(fields.get("pid"), int),
        pid_alive=fields.get("pid_alive") == "1",
        supervisor_alive=fields.get("supervisor_alive") == "1",
        exit_code=number_or_none(fields.get("exit_code"), int),
        stopped=fields.get("stopped") == "1",
        foreign=fields.get("foreign") or None,
        host_now_epoch=number_or_none(fields.get("now"), float),
        started_at_epoch=number_or_none(fields.get("started_at"), float),
        progress=parse_progress(lines[record + 1 :]),
    )
