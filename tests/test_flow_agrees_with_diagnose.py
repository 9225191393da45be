"""The flow's health poll (the real bash snapshot script) and `relaunch diagnose` agree on every fixture."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relaunch.cli.app import app
from relaunch.config import Target, Thresholds
from relaunch.judging.diagnosis import diagnose
from relaunch.tasks.health import collect_snapshot
from tests.test_diagnose_fixtures import CASES, LOGS


def own_start_time() -> str:
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    return stat.rsplit(") ", 1)[1].split()[19]


def recorded_run(tmp_path: Path, log: Path, exit_code: int | None, running: bool, quiet_seconds: float | None) -> Target:
    """State files exactly as the supervisor writes them, around a captured log."""
    target = Target(
        name="replay",
        repo_dir=str(tmp_path),
        venv_dir=str(tmp_path / "venv"),
        lock_file="x",
        launch_command="true",
        log_dir=str(tmp_path / "logs"),
        state_dir=str(tmp_path / "state"),
        tmux_session=f"replay-{tmp_path.name}",
    )
    Path(target.log_dir).mkdir(parents=True, exist_ok=True)
    run = Path(target.state_path) / "runs" / "r1"
    run.mkdir(parents=True)
    copy = Path(target.log_dir) / "r1.log"
    shutil.copy(log, copy)
    (Path(target.state_path) / "current").write_text("r1\n")
    (run / "log_path").write_text(f"{copy}\n")
    (run / "started_at").write_text(f"{time.time() - 60}\n")  # older kernel lines on this host are not this run's
    pid = f"{os.getpid()} {own_start_time()}" if running else "999999 1"
    (run / "pid").write_text(pid + "\n")
    if exit_code is not None:
        (run / "exit_code").write_text(f"{exit_code}\n")
    if quiet_seconds:
        stamp = time.time() - quiet_seconds
        os.utime(copy, (stamp, stamp))
    return target


REPLAYABLE = [c for c in CASES if "--dmesg" not in c[1]]


@pytest.mark.parametrize(
    ("fixture", "options", "verdict", "cause", "package", "quoted"), REPLAYABLE, ids=[f"{c[0]} {' '.join(c[1][:2])}" for c in REPLAYABLE]
)
def test_the_flows_poll_and_diagnose_agree_on_each_fixture(tmp_path, fixture, options, verdict, cause, package, quoted):
    opts = dict(zip(options[::1], options[1::1]))
    running = "--running" in options
    exit_code = int(opts["--exit-code"]) if "--exit-code" in opts else None
    quiet = float(opts.get("--seconds-since-log-write", 0)) or None
    baseline = float(opts["--baseline-tokens-per-second"]) if "--baseline-tokens-per-second" in opts else None
    target = recorded_run(tmp_path, LOGS / fixture, exit_code, running, quiet)
    snap = collect_snapshot(target, wait_seconds=0)
    flow = diagnose(snap, Thresholds(baseline_tokens_per_second=baseline))
    cli = json.loads(CliRunner().invoke(app, ["diagnose", str(LOGS / fixture), *options, "--json"]).output)
    if flow.watching:
        # A live run is never called stalled on one look of the flow: it watches for the window (its journal has one
        # poll). `diagnose` of a saved log has only that one look, told how quiet it is, and judges it.
        assert running and (cli["verdict"], verdict) == ("stalled", "stalled"), (flow, cli)
        assert not flow.settled
        return
    assert (
        (flow.verdict.value, flow.cause.value if flow.cause else None, flow.package)
        == (cli["verdict"], cli["cause"], cli["package"])
        == (verdict, cause, package)
    )
