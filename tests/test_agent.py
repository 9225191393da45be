"""The warm agent (relaunch/cli/agent.py): commands run through it exactly as in-process, with the caller's
environment, folder, streams and signals; never for code it was not started with; never for someone else."""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from relaunch.cli import agent
from relaunch.config import Target
from relaunch.tasks.launch import launch
from relaunch.testing.faults import write_target
from relaunch.testing.targets import shell_target, stop_all

RELAUNCH = str(Path(sys.executable).parent / "relaunch")
CHILD = re.compile(r"child (\d+): (\S+)")


def env_for(home: Path, runtime: Path, **extra: str) -> dict[str, str]:
    """A plain shell's environment with its own agent folder (XDG_RUNTIME_DIR) and Prefect home."""
    return {
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "PREFECT_HOME": str(home / ".prefect"),
        "XDG_RUNTIME_DIR": str(runtime),
        "DO_NOT_TRACK": "1",
        **extra,
    }


def typed(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([RELAUNCH, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def children(runtime: Path) -> list[tuple[int, str]]:
    """(PID, command) of every child the agent logged."""
    logs = list((runtime / f"relaunch-agent-{os.getuid()}").glob("*.log"))
    return [(int(m[1]), m[2]) for log in logs for m in CHILD.finditer(log.read_text())]


@pytest.fixture
def place(tmp_path: Path):
    """A home, an agent folder of its own, and an agent started there; stopped (by its recorded PID) after."""
    home = tmp_path / "home"
    home.mkdir()
    # Short: a Unix socket's path has 107 bytes at most, and pytest's folders under xdist come close.
    runtime = Path(tempfile.mkdtemp(prefix="ra-", dir="/tmp"))
    env = env_for(home, runtime)
    started = typed(["agent", "start"], env, home)
    assert started.returncode == 0 and "relaunch agent running (PID" in started.stdout, started.stdout + started.stderr
    yield home, runtime, env
    stopped = typed(["agent", "stop"], env, home)
    # A failed test may leave one running: by its recorded PID and start time, never by name.
    for _, pid, running in agent.recorded_agents(runtime / f"relaunch-agent-{os.getuid()}"):
        if running:
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(runtime, ignore_errors=True)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def test_a_socket_path_too_long_for_unix_sockets_is_refused_with_what_to_do(tmp_path):
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    started = typed(["agent", "start"], env_for(tmp_path, deep), tmp_path)
    assert started.returncode == 1 and "over the 107 a Unix socket may have" in started.stderr and "XDG_RUNTIME_DIR" in started.stderr


def test_a_command_through_the_agent_prints_and_exits_as_it_does_in_process(place, tmp_path, prefect_harness):
    home, runtime, env = place
    from prefect.settings import PREFECT_API_URL

    env = {**env, "PREFECT_API_URL": PREFECT_API_URL.value()}
    t = shell_target(tmp_path / "t", name="agent")
    write_target(t, home / "target.yaml")
    try:
        # A relative path: the child works in the caller's folder, not the agent's (/).
        recovered = typed(["recover", "target.yaml"], env, home)
        assert recovered.returncode == 0 and "verdict: healthy" in recovered.stdout, recovered.stdout + recovered.stderr
        assert "Finished in state Completed" in recovered.stderr, "Prefect's log lines reach the caller's stderr"
        stopped = typed(["stop", "target.yaml"], env, home)
        assert stopped.returncode == 0 and "stopped (" in stopped.stdout
        through_agent = typed(["check", "target.yaml", "--json"], env, home)
        in_process = typed(["check", "target.yaml", "--json"], {**env, "RELAUNCH_AGENT": "off"}, home)
        assert through_agent.returncode == in_process.returncode == 0, "a run a person stopped is stopped on purpose"
        assert '"verdict": "stopped"' in through_agent.stdout and '"verdict": "stopped"' in in_process.stdout
        assert "Beginning flow run" in through_agent.stderr
        quiet = typed(["check", "target.yaml"], {**env, "PREFECT_LOGGING_LEVEL": "WARNING"}, home)
        assert quiet.returncode == 0 and "Beginning flow run" not in quiet.stderr, "the caller's logging settings, not the agent's"
        bad = typed(["check", "missing.yaml"], env, home)
        assert bad.returncode == 2 and "missing.yaml" in bad.stderr, "a bad target file is exit 2 through the agent too"
    finally:
        stop_all(t)
    served = [command for _, command in children(runtime)]
    assert served == ["recover", "stop", "check", "check", "check"], f"the agent ran these (RELAUNCH_AGENT=off ran in-process): {served}"


def test_the_agents_child_takes_the_callers_prefect_settings_not_the_agents(place, tmp_path, prefect_harness):
    """The agent started with no API configured; a caller's PREFECT_API_URL decides where the flow run goes."""
    home, runtime, env = place
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL
    from prefect.utilities.asyncutils import run_coro_as_sync

    t = shell_target(tmp_path / "t", name=f"settings-{os.getpid()}")
    write_target(t, home / "target.yaml")
    # A request far over one socket message, with quotes and a newline in it, arrives whole.
    odd = {**{f"BIG{i}": "x" * 100_000 for i in range(3)}, "QUOTED": "a \"b\" 'c'\nd $(e)"}
    checked = typed(["check", "target.yaml"], {**env, **odd, "PREFECT_API_URL": PREFECT_API_URL.value()}, home)
    assert checked.returncode == 1, checked.stdout + checked.stderr

    async def runs() -> list:
        async with get_client() as client:
            return await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=f"check-{t.name}:")))

    assert len(run_coro_as_sync(runs())) == 1, "the check's flow run is in the server the caller named"
    assert [c for _, c in children(runtime)] == ["check"]


def launched(tmp_path: Path, home: Path, name: str) -> Target:
    """A stepping shell trainer, its target file in HOME as target.yaml."""
    t = shell_target(tmp_path / "t", name=name)
    write_target(t, home / "target.yaml")
    launch.fn(t, 1)
    return t


def following(env: dict[str, str], home: Path) -> subprocess.Popen:
    """`relaunch logs -f` through the agent, returned once its first line came: the child runs by then."""
    proc = subprocess.Popen(
        [RELAUNCH, "logs", "-f", "-n", "1", "target.yaml"], env=env, cwd=home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert _read_line(proc).startswith("step="), "the child writes onto the caller's stdout"
    return proc


def _read_line(proc: subprocess.Popen, timeout: float = 60) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    assert sel.select(timeout), "no output in time"
    return proc.stdout.readline()


def _gone(pid: int, timeout: float = 30) -> bool:
    """Await the end of a process that is not our child (its pidfd turns readable)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        return bool(sel.select(timeout))
    finally:
        os.close(fd)


def test_ctrl_c_reaches_the_command_and_a_killed_client_takes_its_command_down(place, tmp_path):
    home, runtime, env = place
    t = launched(tmp_path, home, "agent-signals")
    try:
        follow = following(env, home)
        ((child, command),) = children(runtime)
        assert command == "logs"
        follow.send_signal(signal.SIGINT)
        _, err = follow.communicate(timeout=30)
        assert follow.returncode == 130 and "relaunch: interrupted" in err, (follow.returncode, err)
        assert _gone(child), "the child ended with the Ctrl-C"

        killed = following(env, home)
        child = children(runtime)[-1][0]
        killed.kill()
        killed.wait(30)
        assert _gone(child), "a SIGKILLed client's command does not run on in the agent"
    finally:
        stop_all(t)


def test_an_agent_for_other_code_serves_nothing_and_stop_still_stops_it(place, tmp_path):
    home, runtime, env = place
    folder = runtime / f"relaunch-agent-{os.getuid()}"
    # What the agent looks like once relaunch's code changes under it: its name is no longer the code's hash.
    for f in folder.iterdir():
        f.rename(f.with_name("0" * 20 + f.suffix))
    status = typed(["agent", "status"], env, home)
    assert status.returncode == 1 and "started for older code" in status.stdout, status.stdout
    version_like = typed(["diagnose", "/dev/null"], env, home)
    assert version_like.returncode in (0, 1, 2) and children(runtime) == [], "nothing ran in the old agent"
    pid = int((folder / ("0" * 20 + ".pid")).read_text().split()[0])
    assert typed(["agent", "stop"], env, home).returncode == 0
    assert _gone(pid)


def test_an_agent_folder_open_to_other_users_is_never_used(place):
    home, runtime, env = place
    folder = runtime / f"relaunch-agent-{os.getuid()}"
    folder.chmod(0o755)
    try:
        ran = typed(["diagnose", "/dev/null"], env, home)
        assert children(runtime) == [], f"a folder others can enter is not trusted: {ran.stderr}"
        again = typed(["agent", "start"], env, home)
        assert again.returncode == 1 and "open to other users" in again.stderr and "chmod 700" in again.stderr
    finally:
        folder.chmod(0o700)


def test_the_code_key_changes_with_any_file_a_child_would_run(tmp_path):
    for package in ("relaunch", "flows", "tasks", "demo"):
        (tmp_path / package / "host").mkdir(parents=True)
        (tmp_path / package / "x.py").write_text("X = 1\n")
    (tmp_path / "relaunch" / "host" / "stop.sh").write_text("true\n")
    before = agent.code_key(tmp_path)
    assert agent.code_key(tmp_path) == before
    script = tmp_path / "relaunch" / "host" / "stop.sh"
    os.utime(script, ns=(time.time_ns(), script.stat().st_mtime_ns + 1))
    assert agent.code_key(tmp_path) != before, "a host script edited since the start"
    (tmp_path / "tasks" / "new.py").write_text("")
    assert len({before, agent.code_key(tmp_path)}) == 2


def test_an_idle_agent_stops_and_removes_its_socket(tmp_path):
    folder = tmp_path / "agent"
    folder.mkdir(mode=0o700)
    sock = folder / "k.sock"
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaunch.cli.agent_server", "serve", str(sock), "0.5", str(write_fd)],
        pass_fds=(write_fd,),
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(write_fd)
    assert os.read(read_fd, 16) == b"ready\n" and sock.exists()
    os.close(read_fd)
    assert proc.wait(60) == 0 and not sock.exists(), proc.stderr.read()


def test_an_environment_that_is_not_utf8_is_carried_too(place):
    """Python holds such bytes as surrogates, JSON escapes them, the child's environment gets the same bytes."""
    home, runtime, env = place
    fixture = Path(__file__).parent / "fixtures" / "logs" / "demo" / "fx_race_cpu_multiple_tracers.log"
    odd = typed(["diagnose", str(fixture)], {**env, "ODD": "caf\udce9"}, home)
    assert odd.returncode == 1 and "fx_tracing_race" in odd.stdout, odd.stdout + odd.stderr
    assert [c for _, c in children(runtime)] == ["diagnose"]


def test_a_stopping_agent_takes_no_new_command_and_finishes_the_running_one(place, tmp_path):
    home, runtime, env = place
    folder = runtime / f"relaunch-agent-{os.getuid()}"
    t = launched(tmp_path, home, "agent-drain")
    try:
        follow = following(env, home)
        stopping = subprocess.Popen(
            [RELAUNCH, "agent", "stop"], env=env, cwd=home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 30
        while list(folder.glob("*.sock")) and time.monotonic() < deadline:
            time.sleep(0.05)  # the agent closes its socket at once when asked to stop; nothing to wait on but the file
        assert not list(folder.glob("*.sock")), "the stopping agent still takes commands"
        fixture = Path(__file__).parent / "fixtures" / "logs" / "demo" / "fx_race_cpu_multiple_tracers.log"
        meanwhile = typed(["diagnose", str(fixture)], env, home)
        assert meanwhile.returncode == 1 and "fx_tracing_race" in meanwhile.stdout
        assert [c for _, c in children(runtime)] == ["logs"], "the new command ran in-process"
        assert stopping.poll() is None, "the agent waits for the command it runs"
        follow.send_signal(signal.SIGINT)
        follow.communicate(timeout=30)
        out, err = stopping.communicate(timeout=60)
        assert stopping.returncode == 0 and "stopped relaunch agent(s)" in out, out + err
    finally:
        stop_all(t)
