"""`relaunch status` tells the truth now (issue 45): one cheap look at each host (the watch's look) beside the last
report; a SIGKILLed trainer reads dead since its exit record's time, not the last report's `healthy`; the exit code
says whether every run is fine now; without any Prefect server, what the hosts know; messages cut between words.

Real trainers in tmux (relaunch/testing/targets.py), the CLI as typed from a plain shell, a real Prefect server where
reports are read (the session's, tests/conftest.py prefect_harness), and sshd's absence for a host that refuses.
"""

from __future__ import annotations

import json
import os
import signal
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from relaunch.cli.status import NowState, clip, now_of
from relaunch.judging.watching import Pulse
from relaunch.plans.status import launched_at
from relaunch.tasks.launch import launch
from relaunch.testing.faults import write_target
from relaunch.testing.sshd import free_port
from relaunch.testing.targets import current, wait_for_exit
from tests.typed_cli import home, made, typed  # noqa: F401 - fixtures shared with the other CLI-as-typed tests


def sigkill_trainer(target) -> Path:
    """SIGKILL the run's recorded trainer, as a person or the OOM killer would; back once its exit is recorded."""
    run = Path(target.state_path) / "runs" / current(target)
    os.kill(int((run / "pid").read_text().split()[0]), signal.SIGKILL)
    wait_for_exit(target)
    return run / "exit_code"


def test_a_sigkilled_trainer_reads_dead_since_its_exit_record_beside_the_last_healthy_report_and_exits_1(made, home, prefect_harness):
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    t = made()
    launch.fn(t, 1)
    target = write_target(t, home / "target.yaml")
    checked = typed(["check", str(target)], home, api)
    assert checked.returncode == 0 and "verdict: healthy" in checked.stdout, checked.stdout + checked.stderr
    record = sigkill_trainer(t)

    done = typed(["status", "--json", str(target)], home, api)
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = json.loads(done.stdout)
    assert line["verdict"] == "healthy", "the last report is still shown, beside the run now"
    now = line["now"]
    assert (now["state"], now["exit_code"], now["pid"]) == ("dead", 137, int((record.parent / "pid").read_text().split()[0]))
    # When it happened: the exit record's time (to the second), not when status looked.
    assert datetime.fromisoformat(now["since"]) == datetime.fromtimestamp(int(record.stat().st_mtime), UTC)

    text = typed(["status", str(target)], home, api)
    assert text.returncode == 1, text.stderr
    header, row = text.stdout.splitlines()
    assert header.split()[:4] == ["TARGET", "HOST", "NOW", "SINCE"], header
    assert "dead (exit 137)" in row and "healthy since" in row and "`relaunch check` says why" in row, row
    print(f"\n{header}\n{row}")


def test_without_any_prefect_server_status_shows_what_the_hosts_know_and_exits_by_the_runs_now(made, home, tmp_path):
    t = made()
    launch.fn(t, 1)
    here = write_target(t, home / "here.yaml")
    # A host where nothing listens: its row says why it cannot be reached, at once, and is no death.
    port = free_port()
    refusing = {**yaml.safe_load(here.read_text()), "name": "elsewhere", "host": {"kind": "ssh", "hostname": "127.0.0.1", "port": port}}
    (home / "elsewhere.yaml").write_text(yaml.safe_dump(refusing))
    fleet = home / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"targets": ["here.yaml", "elsewhere.yaml"]}))

    both = typed(["status", "--json", str(fleet)], home)
    assert both.returncode == 1, both.stdout + both.stderr
    running, unreachable = json.loads(both.stdout)
    assert running["now"]["state"] == "running" and running["verdict"] is None
    assert datetime.fromisoformat(running["now"]["since"]) == launched_at(current(t)), "since: the run's launch"
    assert unreachable["now"]["state"] == "unreachable" and "Connection refused" in unreachable["now"]["detail"], unreachable
    assert "no Prefect API is configured: NOW is from the hosts alone" in both.stderr, both.stderr

    alone = typed(["status", str(here)], home)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    header, row = alone.stdout.splitlines()
    assert header.split() == ["TARGET", "HOST", "NOW", "SINCE", "MESSAGE"] and " running " in row, alone.stdout

    stopped = typed(["stop", "--yes", str(here)], home)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    after = typed(["status", "--json", str(here)], home)
    assert after.returncode == 0 and json.loads(after.stdout)[0]["now"]["state"] == "stopped", after.stdout + after.stderr


def pulse(**fields) -> Pulse:
    return Pulse(**{"run_id": "20261206T043017.256116Z-a1", "pid": 4242, **fields})


@pytest.mark.parametrize(
    ("look", "state"),
    [
        (pulse(pid_alive=True, supervisor_alive=True), NowState.RUNNING),
        (pulse(pid_alive=True, supervisor_alive=True, stopped=True), NowState.RUNNING),  # a stop that did not end it
        (pulse(exit_code=137), NowState.DEAD),
        (pulse(supervisor_alive=True), NowState.DEAD),  # its exit being recorded
        (pulse(), NowState.DEAD),  # supervisor gone too: no exit recorded
        (pulse(exit_code=0), NowState.EXITED),
        (pulse(exit_code=143, stopped=True), NowState.STOPPED),
        (pulse(run_id=None, stopped=True), NowState.STOPPED),
        (pulse(run_id=None), NowState.NOT_LAUNCHED),
        (pulse(foreign="other /srv/other other"), NowState.FOREIGN),
    ],
)
def test_each_look_reads_as_the_run_now_and_only_a_live_stopped_or_exit_0_run_is_fine(look, state):
    now = now_of(look, datetime(2026, 12, 6, 4, 30, 23, tzinfo=UTC))
    assert now.state is state, now
    assert now.fine is (state in (NowState.RUNNING, NowState.STOPPED, NowState.EXITED))
    if state is NowState.RUNNING:
        assert now.since == datetime(2026, 12, 6, 4, 30, 17, 256116, tzinfo=UTC), "a live run: since its launch"
    elif state is NowState.DEAD and look.exit_code is not None:
        assert now.since == datetime(2026, 12, 6, 4, 30, 23, tzinfo=UTC) and now.cell() == "dead (exit 137)"


@given(st.lists(st.text(alphabet="abcdefghij`()-:,", min_size=1, max_size=14), min_size=1, max_size=30), st.integers(20, 100))
def test_a_message_is_cut_between_words_never_inside_one(words, limit):
    text = " ".join(words)
    cut = clip(text, limit)
    assert len(cut) <= limit
    if len(text) <= limit:
        assert cut == text
        return
    assert cut.endswith("...")
    kept = cut[:-3].split()
    if max(len(w) for w in words) < limit - 3:  # a word longer than the room is the one thing cut inside
        assert kept == words[: len(kept)], f"{cut!r} cuts a word of {text!r}"
