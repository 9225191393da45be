"""The temporary Prefect server of a `relaunch` run dies with it, however the run ends; a configured server is left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from relaunch.config import Target, Thresholds
from relaunch.tempserver import PREFECT_APP, needs_temp_server, start, start_for_cli
from tests.targets import shell_target, stop_all

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
        from tasks.launch import launch

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
    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError("a server process was started")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    env = {"PREFECT_API_URL": "http://127.0.0.1:4200/api"}
    assert start_for_cli(["recover", "t.yaml"], env) is None
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
