"""A Prefect API that accepts connections and never answers ends every command that talks to it in bounded time:
exit 3, the URL named, nothing done on any host. The real CLI (in-process and through the warm agent), a real
listening socket that accepts and never replies, a real small target that a recovery would launch."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from relaunch.cli import agent
from relaunch.cli.tempserver import API_ANSWER_SECONDS, API_REQUEST_TIMEOUT_SECONDS, api_client_defaults
from relaunch.config import Target
from relaunch.testing.faults import write_target
from relaunch.testing.targets import shell_target, tmux_alive

RELAUNCH = str(Path(sys.executable).parent / "relaunch")
# What the command may take beyond the API's answer window: the CLI's start (Python, Prefect's imports) on a loaded
# 2-core host. Without the bound, Prefect's client alone waits (1 + 5 retries) x its request timeout per request.
START_SECONDS = 60.0
BOUND_SECONDS = API_ANSWER_SECONDS + START_SECONDS


class HungApi:
    """A TCP listener on a kernel-chosen port that accepts every connection, reads nothing and never answers."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/api"
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed at teardown
            self.accepted.append(conn)  # held open: the client sees a connection that never answers

    def close(self) -> None:
        self.listener.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def hung_api() -> Iterator[HungApi]:
    api = HungApi()
    yield api
    api.close()


def env_for(home: Path, api_url: str, **extra: str) -> dict[str, str]:
    """A plain shell's environment (as tests/test_cli.py types commands) pointing at API_URL."""
    return {
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "PREFECT_HOME": str(home / ".prefect"),
        "PREFECT_API_URL": api_url,
        "DO_NOT_TRACK": "1",
        "RELAUNCH_AGENT": "off",
        **extra,
    }


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ROOT with its size and modification time: what a host action would change."""
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def run_bounded(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, float]:
    """Run the CLI in a session of its own; its exit code, stderr and seconds taken. Past the bound it is killed
    (its whole session: a CLI that hangs must not outlive the test) and the test fails."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [RELAUNCH, *args], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=BOUND_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"`relaunch {' '.join(args)}` was still running after {BOUND_SECONDS:.0f} s against a hung API:\n{err[-3000:]}")
    return proc.returncode, err, time.monotonic() - start


def unlaunched_target(tmp_path: Path, name: str) -> tuple[Path, Path, Target]:
    """A small real target that was never launched: any recovery that got going would launch it."""
    work = tmp_path / name
    target = shell_target(work, name=name)
    return write_target(target, tmp_path / f"{name}.yaml"), work, target


def assert_untouched(work: Path, before: dict[str, tuple[int, int]], target: Target) -> None:
    assert tree(work) == before, "the target's folders changed"
    assert not Path(target.state_path).exists(), f"a state folder was made: {target.state_path}"
    assert not Path(target.log_dir).exists() and not Path(target.venv_dir).exists(), "a venv or log was made"
    assert not tmux_alive(target.tmux_session), "a trainer was launched"


@pytest.mark.parametrize("command", ["check --recover", "recover", "fleet"])
def test_a_prefect_api_that_never_answers_ends_the_command_with_exit_3_naming_the_url_and_nothing_done(
    tmp_path: Path, hung_api: HungApi, command: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    spec, work, target = unlaunched_target(tmp_path, "hung")
    if command == "fleet":
        fleet = tmp_path / "fleet.yaml"
        fleet.write_text(yaml.safe_dump({"targets": [spec.name]}))
        args = ["fleet", str(fleet)]
    else:
        args = [*command.split(), str(spec)]
    before = tree(work)

    code, err, took = run_bounded(args, env_for(home, hung_api.url), home)

    assert code == 3, f"exit {code}:\n{err[-3000:]}"
    assert f"the Prefect API at {hung_api.url} accepted the connection but did not answer" in err, err[-3000:]
    assert "nothing was done on any host" in err and "what to do:" in err and "PREFECT_API_URL" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert hung_api.accepted, "the CLI never connected to the API it was given"
    assert_untouched(work, before, target)
    print(f"`relaunch {command}` ended {took:.1f} s after its start")


@pytest.fixture
def agent_env(tmp_path: Path, hung_api: HungApi) -> Iterator[tuple[Path, dict[str, str]]]:
    """An agent of its own (XDG_RUNTIME_DIR), started with no API configured; stopped by its recorded PID after."""
    home = tmp_path / "home"
    home.mkdir()
    runtime = Path(tempfile.mkdtemp(prefix="ra-", dir="/tmp"))  # short: a Unix socket's path has 107 bytes at most
    plain = {k: v for k, v in env_for(home, "", XDG_RUNTIME_DIR=str(runtime)).items() if k not in ("PREFECT_API_URL", "RELAUNCH_AGENT")}
    started = subprocess.run([RELAUNCH, "agent", "start"], env=plain, cwd=home, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0 and "relaunch agent running (PID" in started.stdout, started.stdout + started.stderr
    try:
        yield home, {**plain, "PREFECT_API_URL": hung_api.url}
    finally:
        subprocess.run([RELAUNCH, "agent", "stop"], env=plain, cwd=home, capture_output=True, text=True, timeout=60)
        for _, pid, running in agent.recorded_agents(runtime / f"relaunch-agent-{os.getuid()}"):
            if running:
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(runtime, ignore_errors=True)


def test_through_the_warm_agent_a_prefect_api_that_never_answers_ends_the_command_with_exit_3_too(
    tmp_path: Path, hung_api: HungApi, agent_env: tuple[Path, dict[str, str]]
) -> None:
    home, env = agent_env
    spec, work, target = unlaunched_target(tmp_path, "hungagent")
    before = tree(work)

    code, err, _ = run_bounded(["check", "--recover", str(spec)], env, home)

    assert code == 3, f"exit {code}:\n{err[-3000:]}"
    assert f"the Prefect API at {hung_api.url} accepted the connection but did not answer" in err, err[-3000:]
    assert hung_api.accepted, "the agent's child never connected to the caller's API"
    assert_untouched(work, before, target)


def test_relaunch_bounds_prefects_request_timeout_only_where_the_user_set_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no .env, prefect.toml or pyproject.toml here
    home = tmp_path / "prefect-home"
    home.mkdir()
    nothing = {"PREFECT_HOME": str(home)}
    api_client_defaults(nothing)
    assert nothing["PREFECT_API_REQUEST_TIMEOUT"] == f"{API_REQUEST_TIMEOUT_SECONDS:g}"

    own = {"PREFECT_HOME": str(home), "PREFECT_API_REQUEST_TIMEOUT": "120"}
    api_client_defaults(own)
    assert own["PREFECT_API_REQUEST_TIMEOUT"] == "120"

    # Set in the active profile (`prefect config set`): an environment variable would outrank it, so none is set.
    (home / "profiles.toml").write_text('active = "mine"\n\n[profiles.mine]\nPREFECT_API_REQUEST_TIMEOUT = "90"\n')
    in_profile = {"PREFECT_HOME": str(home)}
    api_client_defaults(in_profile)
    assert "PREFECT_API_REQUEST_TIMEOUT" not in in_profile

    (home / "profiles.toml").unlink()
    (tmp_path / "prefect.toml").write_text("[api]\nrequest_timeout = 90\n")
    in_toml = {"PREFECT_HOME": str(home)}
    api_client_defaults(in_toml)
    assert "PREFECT_API_REQUEST_TIMEOUT" not in in_toml
