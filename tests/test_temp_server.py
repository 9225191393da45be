"""The temporary Prefect server of a `relaunch` run dies with it, however the run ends; a configured server is left alone."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from relaunch.cli.tempserver import PREFECT_APP, needs_temp_server, start, start_for_cli
from relaunch.config import Target, Thresholds
from relaunch.testing.targets import shell_target, stop_all

RELAUNCH = str(Path(sys.executable).parent / "relaunch")
ROOT = Path(__file__).resolve().parent.parent
BOOT_SECONDS = 120  # CLI start to its first health poll, on a loaded 2-core host
GONE_SECONDS = 15


def _state(pid: int) -> str | None:
    """The process state letter, None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def _dead(pid: int) -> bool:
    # A zombie holds no memory; an init that does not reap (some containers) would keep it listed.
    return _state(pid) in (None, "Z")


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _servers_under(root: int) -> set[int]:
    """Live Prefect API servers among the descendants of `root` (ours or Prefect's own: both serve PREFECT_APP)."""
    parents = {int(p.name): _parent(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()}
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= more
        grew = bool(more)
    return {pid for pid in tree - {root} if PREFECT_APP in _cmdline(pid) and not _dead(pid)}


def _wait_until(done: Callable[[], bool], seconds: float, what: str) -> float:
    """Poll `done` until true; the seconds it took. Fails with `what` at the deadline."""
    start = time.monotonic()
    while not done():
        if time.monotonic() - start > seconds:
            raise AssertionError(f"{what} (waited {seconds} s)")
        time.sleep(0.05)
    return time.monotonic() - start


class Runs:
    """CLI runs and trainers a test started; all of them stopped at teardown, even after a failure."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.targets: list[Target] = []
        self.clis: list[subprocess.Popen[bytes]] = []
        self.servers: set[int] = set()

    def launched_target(self, name: str, **overrides: object) -> Path:
        """A target whose trainer runs in tmux; the path of its YAML file."""
        from relaunch.tasks.launch import launch

        target = shell_target(self.tmp_path / name, name=name, **overrides)
        self.targets.append(target)
        launch.fn(target, 1)
        path = self.tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(target.model_dump(mode="json"), sort_keys=False))
        return path

    def start_cli(self, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        env = {
            **os.environ,
            "PREFECT_HOME": str(self.tmp_path / "prefect-home"),
            "DO_NOT_TRACK": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_LOGGING_LEVEL": "INFO",
        }
        env.pop("PREFECT_API_URL", None)
        output = self.tmp_path / f"cli-{len(self.clis)}.out"
        with open(output, "wb") as out:
            cli = subprocess.Popen(
                [RELAUNCH, *args], env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT
            )
        self.clis.append(cli)
        return cli, output

    def servers_of(self, cli: subprocess.Popen[bytes]) -> set[int]:
        found = _servers_under(cli.pid)
        self.servers |= found  # remembered: once the CLI is gone they are no longer its descendants
        return found

    def cleanup(self) -> None:
        for cli in self.clis:
            if cli.poll() is None:
                cli.kill()
                cli.wait()
        for pid in self.servers:
            if not _dead(pid) and PREFECT_APP in _cmdline(pid):
                os.kill(pid, signal.SIGKILL)
        stop_all(*self.targets)


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    r = Runs(tmp_path)
    try:
        yield r
    finally:
        r.cleanup()


def _output(path: Path) -> str:
    return path.read_text(errors="replace")


def test_a_sigkilled_relaunch_leaves_no_temporary_prefect_server(runs: Runs) -> None:
    # A trainer that prints nothing stays `starting` for the whole grace period: the CLI long-polls it.
    slow = Thresholds(
        startup_grace_seconds=600, poll_interval_seconds=0.5, settle_timeout_seconds=600, healthy_steps=3, stall_window_floor_seconds=600
    )
    path = runs.launched_target("silent", launch_command="sleep 600", thresholds=slow)
    cli, output = runs.start_cli("check", str(path))

    _wait_until(lambda: "silent: starting" in _output(output) or cli.poll() is not None, BOOT_SECONDS, "the CLI never polled the trainer")
    assert cli.poll() is None, f"the CLI ended early:\n{_output(output)[-3000:]}"
    servers = runs.servers_of(cli)
    assert servers, f"no Prefect server under the CLI; its processes: {[_cmdline(p) for p in _servers_under(cli.pid)]}"

    cli.send_signal(signal.SIGKILL)  # the CLI alone, not its process group: the server must notice by itself
    cli.wait()
    took = _wait_until(
        lambda: all(_dead(pid) for pid in servers),
        GONE_SECONDS,
        f"the temporary server outlived the killed CLI: {[_cmdline(p) for p in servers if not _dead(p)]}",
    )
    print(f"server gone {took:.2f} s after the SIGKILL")


def test_a_relaunch_that_exits_normally_leaves_no_temporary_prefect_server(runs: Runs) -> None:
    path = runs.launched_target("healthy")
    cli, output = runs.start_cli("check", str(path))

    deadline = time.monotonic() + BOOT_SECONDS
    while cli.poll() is None and time.monotonic() < deadline:
        runs.servers_of(cli)
        time.sleep(0.05)
    assert cli.poll() == 0, _output(output)[-3000:]
    assert runs.servers, "never saw the CLI's temporary server"
    _wait_until(lambda: all(_dead(pid) for pid in runs.servers), 3, "the temporary server outlived a CLI that exited normally")


def test_a_configured_prefect_api_url_means_relaunch_starts_no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[object, ...]] = []

    def recording_popen(*args: object, **kwargs: object) -> None:
        started.append(args)
        # start_for_cli turns any error into a warning, so raising cannot fail the test: the record does.
        raise OSError("recorded by the test, not started")

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    env = {"PREFECT_API_URL": "http://127.0.0.1:4200/api"}
    assert start_for_cli(["recover", "t.yaml"], env) is None
    assert started == [], f"a server process was started: {started}"
    assert env == {"PREFECT_API_URL": "http://127.0.0.1:4200/api"}


def test_commands_that_run_no_flow_start_no_server(tmp_path: Path) -> None:
    env = {"PREFECT_HOME": str(tmp_path)}
    for argv in (["diagnose", "train.log"], ["rollback-venv", "t.yaml"], ["check", "--help"], ["--help"], []):
        assert not needs_temp_server(argv, env), argv
    assert needs_temp_server(["check", "t.yaml", "--json"], env)


def test_a_server_configured_in_the_prefect_profile_is_left_to_prefect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "prefect-home"
    home.mkdir()
    (home / "profiles.toml").write_text('active = "remote"\n\n[profiles.remote]\nPREFECT_API_URL = "http://127.0.0.1:4200/api"\n')
    env = _env_without_prefect_server(PREFECT_HOME=str(home))

    assert start_for_cli(["check", "t.yaml"], env) is None  # the profile shortcut
    assert start(env) is None  # the server child's own check, through Prefect's settings
    assert "PREFECT_API_URL" not in env
    assert capsys.readouterr().err == ""


def test_with_prefects_ephemeral_mode_off_relaunch_starts_no_server_either(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = _env_without_prefect_server(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_EPHEMERAL_ENABLED="false")

    assert start_for_cli(["check", "t.yaml"], env) is None
    assert "PREFECT_API_URL" not in env
    assert capsys.readouterr().err == ""


def _env_without_prefect_server(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_PROFILE", "PREFECT_PROFILES_PATH")}
    return {**env, **extra}


# Run under `unshare -n` (a network namespace of its own, so 127.0.0.1:4200 is this test's alone, whatever else
# runs on the machine): a web server on 127.0.0.1:4200 answering /api/health with `true` as a Prefect server
# does, run by OWNER ("me", or "nobody": uid 65534, another person), then the CLI command given; its exit code.
_ON_PORT_4200 = """
import os, subprocess, sys, time
owner, python, www, log, *cli = sys.argv[1:]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
serve = [python, "-m", "http.server", "4200", "--bind", "127.0.0.1", "--directory", www]
if owner == "nobody":
    serve = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *serve]
with open(log, "wb") as out:
    server = subprocess.Popen(serve, stdout=out, stderr=subprocess.STDOUT)
try:
    deadline = time.monotonic() + 60
    # Listening, as `ss` sees it: no connection is made to it before the CLI's.
    while not subprocess.run(["ss", "-Hltn", "sport = :4200"], capture_output=True, text=True).stdout.strip():
        if server.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the server on 4200 did not start (exit {server.poll()}): {open(log).read()}")
        time.sleep(0.05)
    sys.exit(subprocess.run(cli).returncode)
finally:
    server.terminate()
    server.wait()
"""


def _can_unshare_net() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


def _python_for_nobody() -> str | None:
    """An interpreter uid 65534 may run (this venv's may sit under a home it cannot enter)."""
    for python in (sys.executable, "/usr/bin/python3"):
        probe = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", "pass"]
        if Path(python).exists() and subprocess.run(probe, capture_output=True).returncode == 0:
            return python
    return None


def _cannot_run_here(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def _cli_beside_a_server_on_4200(tmp_path: Path, owner: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """`relaunch check` on a never-launched target with nothing configured, a server of OWNER on 127.0.0.1:4200.
    The CLI's result, and the server's request log."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not _can_unshare_net():
        _cannot_run_here("needs root, setpriv and `unshare -n` (a network namespace) to stand in another user's server on 4200")
    python = sys.executable if owner == "me" else _python_for_nobody()
    if python is None:
        _cannot_run_here("no Python that uid 65534 can run (this venv's is under a home it cannot enter; install python3)")
    # Outside pytest's folders (mode 700, closed to uid 65534), so that its server does answer like a Prefect one.
    www = Path(tempfile.mkdtemp(prefix="relaunch-4200-", dir="/tmp"))
    (www / "api").mkdir()
    (www / "api" / "health").write_text("true")
    www.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    target = shell_target(tmp_path / "t", name="found")
    spec = tmp_path / "target.yaml"
    spec.write_text(yaml.safe_dump(target.model_dump(mode="json"), sort_keys=False))
    log = tmp_path / "server-4200.log"
    # Nothing configured: no PREFECT_API_URL, a Prefect home of its own, a working folder without settings files.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update({"PREFECT_HOME": str(home / ".prefect"), "RELAUNCH_AGENT": "off", "DO_NOT_TRACK": "1"})
    args = [sys.executable, "-c", _ON_PORT_4200, owner, python, str(www), str(log), RELAUNCH, "check", str(spec)]
    try:
        result = subprocess.run(["unshare", "-n", *args], env=env, cwd=home, capture_output=True, text=True, timeout=BOOT_SECONDS)
    finally:
        shutil.rmtree(www)
    return result, log.read_text(errors="replace")


def test_a_prefect_server_of_this_user_on_port_4200_is_used(tmp_path: Path) -> None:
    result, requests = _cli_beside_a_server_on_4200(tmp_path, "me")
    assert "relaunch: using your Prefect server at http://127.0.0.1:4200/api" in result.stderr, result.stderr[-3000:]
    # Beyond relaunch's own /health probe, Prefect's client sent its requests there (a web server, not a Prefect
    # API, answers them 404: the command then fails, which is not what this test is about).
    asked = [line for line in requests.splitlines() if '"GET /' in line or '"POST /' in line]
    assert any("/api/health" in line for line in asked) and any("/api/health" not in line for line in asked), requests


def test_a_server_of_another_user_on_port_4200_is_never_used_and_the_cli_says_how_to_configure_one(tmp_path: Path) -> None:
    result, requests = _cli_beside_a_server_on_4200(tmp_path, "nobody")
    note = f"relaunch: not using the server on 127.0.0.1:4200, owned by uid 65534, not by you (uid {os.getuid()})"
    assert result.stderr.count(note) == 1, result.stderr[-3000:]
    assert "export PREFECT_API_URL=http://HOST:PORT/api" in result.stderr, result.stderr[-3000:]
    assert "HTTP/1." not in requests, f"the other user's server was asked something:\n{requests}"
    # The check ran, on the temporary server of its own: a verdict on the never-launched target.
    assert "verdict:" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
