"""`make serve` in a real terminal, stopped as people stop it: a tmux pane runs an interactive bash, the test types
`make serve` into it and presses Ctrl-C once, twice, three times in a row, or closes the pane. After each stop no
process that `make serve` started is left (by the PIDs it recorded in PREFECT_HOME, their process groups, and its port),
and the next `make serve` on the same PREFECT_HOME and port starts. One more: a serve.sh killed outright leaves its server
and worker running, and the next `make serve` stops them before it starts.

Every test starts its own `make serve` (20 to 30 s on the 2-core box, without building the demo target:
RELAUNCH_SERVE_PREPARE=0); the file takes about 2 minutes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from relaunch.testing.faults import wait_for

ROOT = Path(__file__).resolve().parent.parent
READY_SECONDS = 180

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def group_members(pgid: int) -> list[int]:
    """Live processes of that process group."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Terminal:
    """One tmux server of its own (never the user's); a pane with an interactive bash; everything it shows, in a file."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.home = base / "home"
        self.port = free_port()
        self.socket = str(base / "tmux.sock")
        self.screen = base / "screen.txt"
        self.screen.touch()
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TMUX"))},
            "PREFECT_HOME": str(self.home),
            "RELAUNCH_SERVE_PORT": str(self.port),
            "RELAUNCH_DEMO_DIR": str(base / "demo"),
            "RELAUNCH_SERVE_PREPARE": "0",
            "PREFECT_SERVER_UI_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PS1": "$ ",
        }

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["tmux", "-S", self.socket, "-f", "/dev/null", *args], env=self.env, capture_output=True, text=True, check=check
        )

    def open(self) -> None:
        """A new pane (a new tmux session), as a person opens a terminal at the repository root."""
        self.tmux("kill-session", "-t", "serve", check=False)
        self.tmux("new-session", "-d", "-s", "serve", "-x", "220", "-y", "50", "-c", str(ROOT), "bash --norc --noprofile")
        self.tmux("pipe-pane", "-t", "serve", "-o", f"cat >> {self.screen}")

    def type(self, line: str) -> None:
        self.tmux("send-keys", "-t", "serve", "-l", line)
        self.tmux("send-keys", "-t", "serve", "Enter")

    def ctrl_c(self) -> None:
        self.tmux("send-keys", "-t", "serve", "C-c")

    def close(self) -> None:
        """The terminal window closed: tmux closes the pane's terminal, its session leader gets SIGHUP."""
        self.tmux("kill-session", "-t", "serve")

    def shown(self, since: int = 0) -> str:
        return self.screen.read_bytes()[since:].decode(errors="replace").replace("\r", "")

    def mark(self) -> int:
        return self.screen.stat().st_size

    def wait_shown(self, pattern: str, since: int, timeout: float) -> re.Match:
        try:
            return wait_for(lambda: re.search(pattern, self.shown(since)), timeout, repr(pattern), 0.05)
        except AssertionError:
            raise AssertionError(f"no {pattern!r} in the terminal after {timeout} s:\n{self.shown(since)[-3000:]}") from None

    def recorded(self) -> dict[str, int]:
        files = {"serve": "serve.pid", "worker": "serve-worker.pid", "server": "server.pid"}
        return {name: int((self.home / f).read_text()) for name, f in files.items() if (self.home / f).exists()}

    def make_serve(self) -> tuple[dict[str, int], int]:
        """`make serve` typed at the prompt; waits for ready; the PIDs it recorded, and where its output began."""
        if self.tmux("has-session", "-t", "serve", check=False).returncode != 0:
            self.open()
        since = self.mark()
        self.type('make serve; echo "make-exit=$?"')
        self.wait_shown(r"\[serve\] ready:|make-exit=\d", since, READY_SECONDS)
        assert "[serve] ready:" in self.shown(since), self.shown(since)[-3000:]
        pids = self.recorded()
        assert set(pids) == {"serve", "worker", "server"} and all(map(alive, pids.values())), (pids, self.shown(since)[-2000:])
        assert answers(self.port)
        return pids, since

    def assert_all_gone(self, pids: dict[str, int], timeout: float, what: str, port: bool = True) -> None:
        """Nothing `make serve` started is left: its PIDs, their process groups (serve.sh's too), its port."""

        def left() -> list[str]:
            out = [f"{name} {pid}" for name, pid in pids.items() if alive(pid)]
            out += [f"process group {pid} ({name}): {group_members(pid)}" for name, pid in pids.items() if group_members(pid)]
            return out + ([f"port {self.port}"] if port and answers(self.port) else [])

        try:
            wait_for(lambda: not left(), timeout, what, 0.1)
        except AssertionError:
            raise AssertionError(f"{what}: still there: {left()}\n{self.shown()[-3000:]}") from None

    def kill_everything(self) -> None:
        """What a failed test leaves: the process groups make serve recorded (if still its own), then the tmux server."""
        for pid in self.recorded().values():
            for member in group_members(pid):
                try:
                    if re.search(rb"prefect|serve\.sh", Path(f"/proc/{member}/cmdline").read_bytes()):
                        os.kill(member, signal.SIGKILL)
                except OSError:
                    pass
        self.tmux("kill-server", check=False)


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    up_to_date = subprocess.run(["make", "-q", "setup"], cwd=ROOT, capture_output=True)
    assert up_to_date.returncode == 0, "`make setup` is out of date (pyproject.toml changed?): run `make setup` first"
    t = Terminal(tmp_path_factory.mktemp("serve-terminal"))
    t.open()
    try:
        yield t
    finally:
        t.kill_everything()


def order(text: str, *patterns: str) -> list[int]:
    """Where each pattern first appears in text (-1: nowhere)."""
    return [m.start() if (m := re.search(p, text)) else -1 for p in patterns]


def test_one_ctrl_c_stops_worker_then_server_and_make_returns_after(term):
    pids, since = term.make_serve()
    # Another `make serve` on the same PREFECT_HOME is told which one runs and how to stop it, and changes nothing.
    other = subprocess.run(
        [str(ROOT / "scripts" / "serve.sh")],
        cwd=ROOT,
        env=term.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert other.returncode == 1 and f"make serve already runs on PREFECT_HOME={term.home} (pid {pids['serve']})" in other.stdout, other
    assert term.recorded() == pids and all(map(alive, pids.values()))

    term.ctrl_c()
    term.wait_shown(r"make-exit=\d+", since, 90)
    term.assert_all_gone(pids, 10, "after one Ctrl-C")
    shown = term.shown(since)
    stopped = order(shown, rf"worker {pids['worker']} stopped", rf"server {pids['server']} stopped", r"Error 130", r"make-exit=2")
    assert -1 not in stopped and stopped == sorted(stopped), shown[-2000:]
    assert "still stopping" not in shown and not term.recorded(), "a clean stop removes its PID files"


def test_a_second_ctrl_c_says_what_is_left_and_the_stop_goes_on_in_order(term):
    pids, since = term.make_serve()
    term.ctrl_c()
    term.wait_shown(r"\[serve\] stopping", since, 10)
    term.ctrl_c()
    term.wait_shown(r"make-exit=\d+", since, 90)
    term.assert_all_gone(pids, 10, "after two Ctrl-C")
    shown = term.shown(since)
    message = r"\[serve\] still stopping \((worker, )?server\); press Ctrl-C again within 2 s to kill them now"
    assert re.search(message, shown), shown[-2000:]
    # make never saw a Ctrl-C: the prompt came back only once the server was stopped, with make's report of exit 130.
    stopped = order(shown, r"still stopping", rf"server {pids['server']} stopped", r"Error 130", r"make-exit=2")
    assert -1 not in stopped and stopped == sorted(stopped), shown[-2000:]
    assert "killing" not in shown


def test_a_closed_terminal_stops_everything_in_order(term):
    pids, _ = term.make_serve()
    log = term.home / "logs" / "serve.log"
    before = log.stat().st_size if log.exists() else 0
    term.close()
    term.assert_all_gone(pids, 60, "after the terminal closed")
    said = log.read_text()[before:]
    stopped = order(said, r"\[serve\] stopping", rf"worker {pids['worker']} stopped", rf"server {pids['server']} stopped")
    assert -1 not in stopped and stopped == sorted(stopped), said
    assert not term.recorded()


def test_a_new_make_serve_stops_what_a_killed_one_left_and_three_ctrl_c_kill_at_once(term):
    old, first = term.make_serve()
    os.kill(old["serve"], signal.SIGKILL)  # no stop at all: its server and worker run on, in sessions of their own
    wait_for(lambda: not alive(old["serve"]), 10, "serve.sh to die")
    # make's own report of the kill reaches the terminal a moment later: awaited, so that the next `make serve` is
    # judged by its own output and not by this one's "make-exit=2" (seen: the mark was taken before it was printed).
    term.wait_shown(r"make-exit=\d+", first, 30)
    assert alive(old["worker"]) and alive(old["server"]) and answers(term.port)

    pids, since = term.make_serve()
    assert f"an earlier make serve left worker {old['worker']} server {old['server']} running: stopping it" in term.shown(since)
    term.assert_all_gone(old, 1, "the earlier run's leftovers", port=False)
    assert pids["server"] != old["server"] and pids["worker"] != old["worker"]

    start = time.monotonic()
    term.ctrl_c()
    term.wait_shown(r"\[serve\] stopping", since, 10)
    term.ctrl_c()
    term.wait_shown(r"still stopping", since, 10)
    term.ctrl_c()
    term.wait_shown(r"make-exit=\d+", since, 30)
    term.assert_all_gone(pids, 5, "after three Ctrl-C")
    assert re.search(r"\[serve\] killing (worker, )?server now", term.shown(since)), term.shown(since)[-2000:]
    assert time.monotonic() - start < 10
