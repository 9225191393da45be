"""What a person sees at 3 a.m. (issue 34): every outcome of a command is one clear answer, on a terminal and in JSON.

A host that cannot be reached, a target file with a typo, a repo_dir that is not there, two targets in one tmux
session, `relaunch status` of one target, an agent of another install: each through the real thing (OpenSSH on
loopback, the CLI as typed from a plain shell, real files, a real Prefect server where records are read).
"""

from __future__ import annotations

import json
import os
import re
import signal
import string
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from relaunch.cli import agent
from relaunch.cli.app import app
from relaunch.cli.status import goodput_of, parse_report, row
from relaunch.config import Target, load_fleet, load_target, load_targets
from relaunch.errors import ConfigError, HostUnreachable, TransportError, is_transient
from relaunch.testing.sshd import free_port, running_sshd
from relaunch.wire.commands import Command
from relaunch.wire.ssh import SSHTransport

RELAUNCH = str(Path(sys.executable).parent / "relaunch")
BASE = {
    "name": "night",
    "repo_dir": "/srv/repo",
    "venv_dir": "/srv/venv",
    "lock_file": "requirements.lock",
    "launch_command": "python train.py",
    "log_dir": "/srv/logs",
    "tmux_session": "train",
}


def plain_env(home: Path, **extra: str) -> dict[str, str]:
    """What `env -i HOME=... PATH=/usr/bin:/bin` gives: no venv on PATH, no Prefect settings, no agent."""
    return {"HOME": str(home), "PATH": "/usr/bin:/bin", "PREFECT_HOME": str(home / ".prefect"), "RELAUNCH_AGENT": "off", **extra}


def typed(args: list[str], home: Path, timeout: float = 180) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run([RELAUNCH, *args], env=plain_env(home), capture_output=True, text=True, timeout=timeout, cwd=home)
    return done, time.monotonic() - start


def write(path: Path, fields: dict) -> Path:
    path.write_text(yaml.safe_dump(fields, sort_keys=False))
    return path


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def refusing_target(home: Path) -> Path:
    """A target on ssh to 127.0.0.1 at a port where nothing listens: every connection is refused at once."""
    host = {"kind": "ssh", "hostname": "127.0.0.1", "port": free_port(), "user": "root", "known_hosts_path": str(home / "kh")}
    return write(home / "target.yaml", {**BASE, "host": host, "state_dir": str(home / "state")})


# ---- 1. a host that cannot be reached -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["check", "recover", "stop"])
def test_a_host_that_refuses_connections_is_one_answer_with_what_to_do_exit_2_within_seconds(home, command):
    target = refusing_target(home)
    port = yaml.safe_load(target.read_text())["host"]["port"]
    done, seconds = typed([command, str(target)], home)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Flow run" not in done.stderr and len(lines) == 2, done.stderr
    assert f"root@127.0.0.1:{port}" in lines[0] and "Connection refused" in lines[0], lines
    assert lines[1].startswith("  what to do: ") and f"sshd listens on port {port}" in lines[1], lines
    # Reached before the temporary server starts and Prefect is imported: about 1 s on a loaded 2-core host. Before:
    # a flow run, and Prefect's retries of the refused connection alone were 2 + 10 s.
    assert seconds < 5, f"{command} took {seconds:.1f} s"
    print(f"\n{command} of a refused host: exit 2 in {seconds:.1f} s")


@pytest.mark.parametrize("command", ["check", "recover", "stop"])
def test_json_gives_an_object_for_a_host_that_cannot_be_reached(home, command):
    done, _ = typed([command, "--json", str(refusing_target(home))], home)
    answer = json.loads(done.stdout)
    assert done.returncode == 2 == answer["exit_code"] and answer["ok"] is False
    assert answer["error"] == "host_unreachable" and answer["host"].startswith("root@127.0.0.1:")
    assert "Connection refused" in answer["message"] and "sshd listens on port" in answer["what_to_do"]


def test_a_host_never_reached_is_not_retried_and_one_reached_before_is():
    with running_sshd() as server:
        closed = SSHTransport(server.ssh_host(port=free_port()))
        with pytest.raises(HostUnreachable) as never:
            closed.execute(Command(argv=("true",), label="probe"))
        assert never.value.first_contact and not is_transient(never.value), "an answer: a wrong port or a host that is down"
        transport = SSHTransport(server.ssh_host())
        assert transport.execute(Command(argv=("true",))).exit_code == 0
        server.stop()
        try:
            with pytest.raises(TransportError) as later:
                transport.execute(Command(argv=("true",), label="after"))
                transport.execute(Command(argv=("true",), label="after"))
        finally:
            server.start()
        assert not getattr(later.value, "first_contact", False) and is_transient(later.value), "sshd restarting: retried"
        transport.close()


def test_a_relaunch_error_inside_a_flow_is_one_line_without_tracebacks_and_json_says_it(home):
    state = home / "state"
    state.mkdir()
    (state / "target").write_text("other /elsewhere other\n")  # the state folder of another target
    target = write(home / "target.yaml", {**BASE, "repo_dir": str(home), "log_dir": str(home / "logs"), "state_dir": str(state)})
    done, _ = typed(["check", str(target)], home)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    # The flow's last log lines reach the temporary server before it stops: none fails on the terminal.
    assert "Error logging to API" not in done.stderr, done.stderr
    assert any(line.startswith("relaunch: on local: the state folder") for line in done.stderr.splitlines()), done.stderr
    as_json, _ = typed(["check", "--json", str(target)], home)
    answer = json.loads(as_json.stdout)
    assert (as_json.returncode, answer["exit_code"], answer["error"]) == (1, 1, "state_folder_taken"), as_json.stdout


def test_a_bad_option_value_is_json_too(home):
    (home / "train.log").write_text("step=1 loss=3.5\n")
    done, _ = typed(["diagnose", "--json", "--started-at", "yesterday", str(home / "train.log")], home)
    answer = json.loads(done.stdout)
    assert done.returncode == 2 == answer["exit_code"] and answer["error"] == "config_error" and "--started-at" in answer["message"]


# ---- 3. the target file --------------------------------------------------------------------------------------------

LONG_FIELDS = sorted(f for f in Target.model_fields if len(f) >= 8 and f not in {"state_dir", "log_dir"})


@st.composite
def misspelled(draw: st.DrawFn) -> tuple[str, str]:
    """A field and one slip of the keyboard in it: a letter dropped, doubled, swapped with the next, or replaced."""
    field = draw(st.sampled_from(LONG_FIELDS))
    i = draw(st.integers(1, len(field) - 2))
    kind = draw(st.sampled_from(["drop", "double", "swap", "replace"]))
    if kind == "drop":
        typo = field[:i] + field[i + 1 :]
    elif kind == "double":
        typo = field[:i] + field[i] + field[i:]
    elif kind == "swap":
        typo = field[:i] + field[i + 1] + field[i] + field[i + 2 :]
    else:
        typo = field[:i] + draw(st.sampled_from(string.ascii_lowercase)) + field[i + 1 :]
    if typo == field or typo in Target.model_fields:
        typo = field[:i] + "x" + field[i:]
    return field, typo


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(slip=misspelled())
def test_an_unknown_field_that_is_a_slip_of_a_known_one_names_it_and_its_line(slip):
    field, typo = slip
    fields = {k: v for k, v in BASE.items() if k != field}
    fields[typo] = BASE.get(field, "x")
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp) / "t.yaml", fields)
        line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.startswith(f"{typo}:"))
        with pytest.raises(ConfigError) as bad:
            load_target(path)
    assert f"{typo} (line {line}): unknown field; did you mean `{field}`?" in str(bad.value), str(bad.value)


def test_a_bad_value_is_shown_with_its_line_and_a_nested_slip_is_named(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False) + "host:\n  kind: ssh\n  prot: 22\n  port: abc\n")
    with pytest.raises(ConfigError) as bad:
        load_target(path)
    text = str(bad.value)
    assert "host.port (line 11): Input should be a valid integer" in text and "(got 'abc')" in text, text
    assert "host.prot (line 10): unknown field; did you mean `port`?" in text, text


def test_two_targets_of_a_fleet_in_one_tmux_session_of_one_host_are_refused_naming_both(tmp_path, home):
    first = {**BASE, "name": "a", "state_dir": "/var/tmp/a"}
    fleet = write(tmp_path / "fleet.yaml", {"targets": [first, {**first, "name": "b", "state_dir": "/var/tmp/b"}]})
    with pytest.raises(ConfigError, match="targets 'a' and 'b' share tmux session 'train' on local"):
        load_fleet(fleet)
    done, _ = typed(["fleet", "--json", str(fleet)], home)
    assert done.returncode == 2 and json.loads(done.stdout)["error"] == "config_error", done.stdout + done.stderr
    elsewhere = {**first, "name": "b", "host": {"kind": "ssh", "hostname": "gpu2"}}
    assert [t.name for t in load_fleet(write(tmp_path / "ok.yaml", {"targets": [first, elsewhere]}))[0]] == ["a", "b"]


def test_a_check_where_repo_dir_is_missing_says_so_and_exits_2(home):
    missing = home / "no-such-checkout"
    target = write(home / "t.yaml", {**BASE, "repo_dir": str(missing), "log_dir": str(home / "logs"), "state_dir": str(home / "s")})
    done, _ = typed(["check", str(target)], home)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"repo_dir {missing} is not a folder on local" in done.stderr and "verdict: unknown" in done.stdout
    # One thing to do, wherever it is said (the flow's last line, its state, the CLI's last line): fix repo_dir. No
    # recovery could launch without the training code, so nothing says to recover it or run the full procedure.
    told = done.stdout + done.stderr
    todo = re.findall(r"what to do: ([^|\n']*)", told)
    assert todo and all(line.startswith("fix repo_dir in ") for line in todo), todo
    assert "recover it" not in told and "run the full procedure" not in told and "not asked to recover" not in told, told
    missing.mkdir()
    there, _ = typed(["check", str(target)], home)
    assert there.returncode == 1 and "no trainer on record" in there.stdout, there.stdout + there.stderr


# ---- 2. relaunch status --------------------------------------------------------------------------------------------


def test_status_takes_one_target_file_and_shows_last_nights_goodput_percentage(tmp_path, prefect_harness):
    from prefect.artifacts import create_table_artifact

    name = f"gp{os.getpid()}"
    target = write(tmp_path / "t.yaml", {**BASE, "name": name})
    night = {"night": "2026-05-01", "goodput_percent": 93.1, "window_minutes": 1440.0}
    total = {**night, "night": "total", "goodput_percent": 88.0}
    # What flows/common.py publish_goodput publishes: the table, and a description whose first word is `goodput`.
    create_table_artifact(table=[night, total], key=f"goodput-{name}", description=f"goodput of {name}: minutes per category")
    done = CliRunner().invoke(app, ["status", "--json", str(target)])
    assert done.exit_code == 1, done.output  # its run is not launched: not fine now
    (line,) = json.loads(done.stdout)
    assert (line["target"], line["goodput"], line["now"]["state"]) == (name, "93.1%", "not launched")
    assert load_targets(target)[0].name == name


def test_since_starts_again_at_a_recovery_between_two_reports_of_one_verdict():
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    t = Target.model_validate(BASE)
    healthy = [
        parse_report(now - timedelta(hours=10), "healthy: fine", "check-training"),
        parse_report(now - timedelta(hours=3), "healthy: recovered", "recover-training"),
        parse_report(now - timedelta(hours=1), "healthy: still fine", "check-training"),
    ]
    assert row(t, healthy, [], None, None).since == now - timedelta(hours=3), "the stop and relaunch between"
    checks_only = [healthy[0], healthy[2]]
    ended = [(now - timedelta(hours=5), "Failed")]  # a recovery that left no report of its own
    assert row(t, checks_only, ended, None, None).since == now - timedelta(hours=1)
    assert row(t, checks_only, [], None, None).since == now - timedelta(hours=10)
    assert goodput_of("goodput of night: minutes per category") is None and goodput_of("93.1% productive") == "93.1%"


# ---- 4. the agent ---------------------------------------------------------------------------------------------------


def test_agent_stop_ends_this_installs_agent_and_leaves_another_installs_running(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    runtime = Path(tempfile.mkdtemp(prefix="ra-", dir="/tmp"))
    env = {**plain_env(home), "XDG_RUNTIME_DIR": str(runtime), "RELAUNCH_AGENT": "on"}
    folder = runtime / f"relaunch-agent-{os.getuid()}"
    started = subprocess.run([RELAUNCH, "agent", "start"], env=env, capture_output=True, text=True, timeout=120, cwd=home)
    assert started.returncode == 0, started.stdout + started.stderr
    # Another install's agent, recorded in the same folder of the same uid: its interpreter and its code are others'.
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        ours = [pid for _, pid, running in agent.recorded_agents(folder) if running]
        (folder / ("f" * 20 + ".pid")).write_text(f"{other.pid} {agent._starttime(other.pid)} {'0' * 16}\n")
        stopped = subprocess.run([RELAUNCH, "agent", "stop"], env=env, capture_output=True, text=True, timeout=120, cwd=home)
        assert stopped.returncode == 0 and f"stopped relaunch agent(s): {ours[0]}" in stopped.stdout, stopped.stdout + stopped.stderr
        assert "1 agent(s) of another relaunch install left running" in stopped.stdout
        assert other.poll() is None, "another install's agent is not this install's to stop"
        assert (folder / ("f" * 20 + ".pid")).exists()
    finally:
        for _, pid, running in agent.recorded_agents(folder):
            if running and pid != other.pid:
                os.kill(pid, signal.SIGKILL)
        other.kill()
        other.wait()


def test_a_retried_relaunch_error_that_prefect_logs_on_the_terminal_carries_no_traceback_and_an_unexpected_one_does(capfd):
    import logging

    from relaunch.cli.root import untraced

    # What Prefect's task engine does once a transient error's retries are exhausted: log.error(..., exc_info=True).
    handler = logging.StreamHandler(open(2, "w", closefd=False))  # noqa: SIM115 - the terminal's stderr, kept open
    log = logging.getLogger("prefect.task_runs.test_cli_outcomes")
    log.addHandler(handler)
    try:
        with untraced():
            for error in (TransportError("root@gpu1:22", "health poll", "connection lost"), ValueError("a bug")):
                try:
                    raise error
                except Exception:
                    log.error("Task run failed with exception: %r - Retries are exhausted", error, exc_info=True)
        handler.flush()
    finally:
        log.removeHandler(handler)
    err = capfd.readouterr().err
    assert "TransportError('on root@gpu1:22" in err and err.count("Traceback") == 1 and "ValueError: a bug" in err, err
