"""What a stop promises, on real tmux and real processes: only what relaunch started, one SIGTERM each, the target's
grace, then SIGKILL; the run's own pane only; a person's stop recorded, a recovery's not.

Each trainer here is a small bash script (outside the repo: the stop never reads it) that says it is ready once its
signal handling is in place; the test waits for that file, never for a fixed time.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from relaunch.cli.app import app
from relaunch.config import Target
from relaunch.tasks.launch import launch
from relaunch.tasks.stop import stop
from relaunch.testing.faults import making, start_time, wait_for
from relaunch.testing.targets import tmux_alive

# Saves on SIGTERM: counts every TERM it gets into $TERMS, then takes 1 s to "save" (still counting), then exits 0.
SAVER = """#!/usr/bin/env bash
trap 'echo TERM >> "$TERMS"' TERM
echo "step=1 loss=3.6441"
: > "$READY"
until [ -s "$TERMS" ]; do sleep 0.05 & wait $!; done
for _ in $(seq 20); do sleep 0.05 & wait $!; done
echo saved > "$SAVED"
exit 0
"""
# Ignores SIGTERM (its sleeps inherit the ignore): only SIGKILL ends it.
DEAF = """#!/usr/bin/env bash
trap '' TERM
echo "step=1 loss=3.6441"
: > "$READY"
while :; do sleep 0.1; done
"""
# Starts a child in a session of its own with a cleared environment (no RELAUNCH_RUN): only its parent links it to the run.
SPAWNER = """#!/usr/bin/env bash
setsid env -i /bin/bash -c 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 1000' _ "$CHILD" &
echo "step=1 loss=3.6441"
until [ -s "$CHILD" ]; do sleep 0.05; done
: > "$READY"
while :; do sleep 0.1; done
"""


@pytest.fixture
def made(tmp_path):
    with making(tmp_path) as make:
        yield make


def trainer(made, tmp_path: Path, script: str, grace: float, **env: str) -> Target:
    """A target whose launch command runs SCRIPT; launched, and ready (its handler set) when this returns."""
    path = tmp_path / f"trainer-{len(list(tmp_path.glob('trainer-*')))}.sh"
    path.write_text(script)
    files = {"READY": str(tmp_path / "ready"), "TERMS": str(tmp_path / "terms"), "SAVED": str(tmp_path / "saved"), **env}
    t = made(launch_command=f"bash {path}", env=files, stop_grace_seconds=grace)
    launch.fn(t, 1)
    wait_for(lambda: Path(files["READY"]).exists(), 30, "the trainer to set its signal handling")
    return t


def run_folder(target: Target) -> Path:
    state = Path(target.state_path)
    return state / "runs" / (state / "current").read_text().strip()


def recorded_pid(target: Target, name: str = "pid") -> int:
    return int((run_folder(target) / name).read_text().split()[0])


def test_a_trainer_that_saves_on_sigterm_gets_exactly_one_and_is_never_sigkilled(made, tmp_path):
    t = trainer(made, tmp_path, SAVER, grace=15)
    pid = recorded_pid(t)
    before = time.time()
    detail = stop.fn(t).detail
    assert (tmp_path / "terms").read_text().splitlines() == ["TERM"], "one SIGTERM per process, not one per way of finding it"
    assert (tmp_path / "saved").read_text() == "saved\n", "the trainer finished its save"
    assert (run_folder(t) / "exit_code").read_text().strip() == "0"
    assert pid in detail.signalled and len(detail.signalled) == len(set(detail.signalled)), detail.output
    assert detail.killed == [] and not (run_folder(t) / "stop_killed_at").exists(), detail.output
    term_at = float((run_folder(t) / "stop_term_at").read_text())
    assert before <= term_at <= time.time()
    assert start_time(pid) is None and not tmux_alive(t.tmux_session)


def test_a_trainer_that_ignores_sigterm_is_sigkilled_after_the_targets_grace(made, tmp_path):
    t = trainer(made, tmp_path, DEAF, grace=1.5)
    pid = recorded_pid(t)
    started = time.monotonic()
    detail = stop.fn(t).detail
    took = time.monotonic() - started
    assert start_time(pid) is None, "the trainer outlived SIGKILL"
    assert pid in detail.killed, detail.output
    assert took >= 1.5, f"SIGKILL came {took:.2f} s after SIGTERM, before the target's grace of 1.5 s"
    assert took < 15, f"the stop took {took:.1f} s: it must follow stop_grace_seconds, not a fixed wait"
    term_at = float((run_folder(t) / "stop_term_at").read_text())
    killed_at = float((run_folder(t) / "stop_killed_at").read_text())
    assert killed_at - term_at >= 1.5
    # The supervisor outlives its trainer's SIGKILL long enough to record how it died.
    assert (run_folder(t) / "exit_code").read_text().strip() == "137"


def user_window(session: str) -> tuple[str, str]:
    """A window the user opens in the run's session, running `sleep infinity`: its pane id and its PID."""
    opened = subprocess.run(
        ["tmux", "new-window", "-d", "-P", "-F", "#{pane_id} #{pane_pid}", "-t", f"={session}:", "sleep", "infinity"],
        capture_output=True,
        text=True,
        check=True,
    )
    pane, pid = opened.stdout.split()
    return pane, pid


def session_panes(session: str) -> list[str]:
    """The pane ids left in every window of the session."""
    return subprocess.run(
        ["tmux", "list-panes", "-s", "-t", f"={session}", "-F", "#{pane_id}"], capture_output=True, text=True
    ).stdout.split()


def test_a_window_the_user_opened_in_relaunchs_session_survives_the_stop(made, tmp_path):
    t = trainer(made, tmp_path, DEAF, grace=1)
    pane, user_pid = user_window(t.tmux_session)
    detail = stop.fn(t).detail
    assert start_time(recorded_pid(t)) is None
    assert start_time(int(user_pid)) is not None, "the user's window was killed with relaunch's pane"
    assert tmux_alive(t.tmux_session), "the session holds the user's window: it stays"
    assert any(p.startswith(f"{pane} (PID {user_pid}: sleep infinity)") for p in detail.panes_left), detail.output
    assert session_panes(t.tmux_session) == [pane], "only the run's own pane was closed"


def test_a_run_recorded_before_panes_were_has_its_pane_found_by_its_launcher_and_only_that_pane_closed(made):
    t = made()
    launch.fn(t, 1)
    for name in ("pane", "pane_id"):  # what a run launched by an older relaunch has: no pane record
        (run_folder(t) / name).unlink(missing_ok=True)
    pane, user_pid = user_window(t.tmux_session)
    detail = stop.fn(t).detail
    assert start_time(int(user_pid)) is not None, detail.output
    assert session_panes(t.tmux_session) == [pane], "the run's own pane (its launcher, then `tail --pid`) is closed, the user's kept"
    assert [p.split()[0] for p in detail.panes_left] == [pane], detail.output


def test_a_session_with_the_targets_name_holding_an_unrelated_program_is_left_alone_and_said(made):
    t = made()
    subprocess.run(["tmux", "new-session", "-d", "-s", t.tmux_session, "sleep", "infinity"], check=True)
    foreign = int(
        subprocess.run(
            ["tmux", "list-panes", "-t", f"={t.tmux_session}", "-F", "#{pane_pid}"], capture_output=True, text=True, check=True
        ).stdout
    )
    started = start_time(foreign)
    detail = stop.fn(t).detail
    assert f"session {t.tmux_session} holds processes relaunch did not start (PIDs {foreign}): left alone" in detail.output
    assert start_time(foreign) == started, "the unrelated program was signalled or replaced"
    assert tmux_alive(t.tmux_session)
    assert detail.signalled == [] and detail.killed == []


def test_a_setsid_child_with_a_cleared_environment_is_stopped_with_its_trainer(made, tmp_path):
    child_file = tmp_path / "child"
    t = trainer(made, tmp_path, SPAWNER, grace=5, CHILD=str(child_file))
    child = int(child_file.read_text())
    environ = Path(f"/proc/{child}/environ").read_bytes()
    assert b"RELAUNCH_RUN=" not in environ, "the child must carry no marker: only the process tree links it to the run"
    detail = stop.fn(t).detail
    assert start_time(child) is None, f"the setsid child {child} survived the stop: {detail.output}"
    assert child in detail.signalled and child not in detail.killed, detail.output


def test_a_persons_stop_is_recorded_and_a_recoverys_stop_is_not(made, tmp_path):
    t = trainer(made, tmp_path, SAVER, grace=15)
    mark = Path(t.state_path) / "stopped"
    stop.fn(t)
    assert not mark.exists(), "a recovery's own stop must not mark the target stopped: the nightly check would leave it dead"
    launch.fn(t, 2)
    wait_for(lambda: start_time(recorded_pid(t)) is not None, 30, "the second trainer")
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(t.model_dump(mode="json")))
    before = time.time()
    result = CliRunner().invoke(app, ["stop", str(path)])
    assert result.exit_code == 0, result.output
    assert "stopped (" in result.output
    assert before <= float(mark.read_text()) <= time.time()
    assert start_time(recorded_pid(t)) is None


def test_a_stop_never_signals_itself_nor_the_process_that_asked_for_it(made):
    # The stop's own process tree must not count as the target's even when it carries the marker (a stop asked for
    # from inside a trainer's environment): the test process stands in for that caller.
    t = made()
    launch.fn(t, 1)
    os.environ["RELAUNCH_TARGET"] = t.state_path
    try:
        detail = stop.fn(t).detail
    finally:
        del os.environ["RELAUNCH_TARGET"]
    assert os.getpid() not in detail.signalled
    assert start_time(recorded_pid(t)) is None


def test_a_persons_stop_of_a_target_never_launched_writes_nothing_on_the_host(made):
    t = made()
    assert not Path(t.state_path).exists()
    stop.fn(t, deliberate=True)
    assert not Path(t.state_path).exists(), sorted(str(p) for p in Path(t.state_path).rglob("*"))


def test_a_persons_stop_of_a_launched_target_is_recorded(made):
    t = made()
    launch.fn(t, 1)
    stop.fn(t, deliberate=True)
    assert (Path(t.state_path) / "stopped").exists()
