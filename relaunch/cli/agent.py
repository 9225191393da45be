"""A warm relaunch: one process that has imported Prefect and the flows forks a child for every command.

`relaunch agent start` leaves it running; every `relaunch ...` after that connects to its socket, hands over
its argv, environment, working directory, umask and its stdin/stdout/stderr (SCM_RIGHTS), and the child runs
the command as the CLI would in-process: same flows, same output, same exit code. What it saves is Python and
Prefect's start (~1.5 s of CPU on a 2-core host; bench/overhead.py). Without an agent nothing changes.

Trust and staleness, checked by the client before it hands anything over:
- the socket lives in a folder of its own, mode 0700, owned by the caller (anything else is not used), and
  the agent accepts only peers of its own uid (SO_PEERCRED);
- the socket's name is a hash of the code it would run (relaunch's, the flows', the tasks', the host
  scripts', Prefect's version file) and of the interpreter: code changed since the agent started finds no
  socket and runs in-process; `relaunch agent start` starts an agent for the new code.
The child leaves with its client: a client that dies (SIGKILL) closes the connection, and the child stops
(SIGTERM) as an in-process CLI would have died with it; Ctrl-C and SIGTERM/SIGHUP on the client reach it.

This module, the client and `relaunch agent start|stop|status`, imports the standard library only: it runs before
anything heavy is imported. The agent's own process is relaunch/cli/agent_server.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import stat
import struct
import sys
from pathlib import Path

# Bytes of a request the client sends in its first message (the rest, if any, follows as plain data).
HEADER = struct.Struct("!I")
CODE = struct.Struct("!ci")  # b"P" + the child's PID, then b"X" + its exit code
OFF_VALUES = ("0", "off", "no", "false")
DEFAULT_IDLE_MINUTES = 60.0
# The code a command's exit status cannot be read from: the agent's process ended without one.
LOST_EXIT_CODE = 3
# A live agent forks within milliseconds; one that does not answer in this long is wedged (stopped, swapped out).
ANSWER_TIMEOUT_SECONDS = 30.0
# A client gets this long to send its whole request: the agent serves one request at a time while reading.
REQUEST_TIMEOUT_SECONDS = 5.0


def enabled(environ: os._Environ[str] | dict[str, str] = os.environ) -> bool:
    return environ.get("RELAUNCH_AGENT", "").strip().lower() not in OFF_VALUES


def agent_dir(environ: os._Environ[str] | dict[str, str] = os.environ) -> Path:
    """Per user: $XDG_RUNTIME_DIR (a tmpfs only the user can enter) where set, else /tmp."""
    base = environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return Path(base) / f"relaunch-agent-{os.getuid()}"


def private_dir_problem(path: Path) -> str | None:
    """Why FOLDER may not hold our socket (None when it may): not a real folder, another owner, or open to others."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder (a link or a file)"
    if st.st_uid != os.getuid():
        return f"{path} belongs to uid {st.st_uid}, not {os.getuid()}"
    if st.st_mode & 0o077:
        return f"{path} is open to other users (mode {stat.S_IMODE(st.st_mode):o}, must be 700)"
    return None


def code_files(root: Path) -> list[Path]:
    """What a child would run: relaunch's own packages and host scripts, in ROOT as a checkout lays them out (flows/,
    tasks/, demo/ beside relaunch/) or as the wheel does (all of them inside relaunch/)."""
    files: list[Path] = []
    for package in ("relaunch", "flows", "tasks", "demo"):
        folder = root / package
        # Every room of the package, at any depth (the core's rooms, the plans, the CLI), and the host scripts.
        files.extend(sorted(folder.rglob("*.py")))
        files.extend(sorted(folder.glob("host/*.sh")))
    return files


def code_key(root: Path | None = None) -> str:
    """A hash of the interpreter and every file a child would run, by path, size and modification time."""
    import importlib.util

    root = root or Path(__file__).resolve().parents[2]  # relaunch/cli/agent.py: the folder holding relaunch/
    h = hashlib.sha256()
    h.update(f"{sys.executable}\0{sys.version}\0{os.getuid()}\0".encode())
    spec = importlib.util.find_spec("prefect")
    prefect_files = [Path(spec.origin)] if spec and spec.origin else []
    for f in [*code_files(root), *prefect_files]:
        try:
            st = f.stat()
        except OSError:
            continue
        h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:20]


def socket_path(environ: os._Environ[str] | dict[str, str] = os.environ, key: str | None = None) -> Path:
    return agent_dir(environ) / f"{key or code_key()}.sock"


# ---------------------------------------------------------------------------------------------
# The client: every `relaunch` command, before anything heavy is imported.


def delegate(argv: list[str]) -> int | None:
    """Run ARGV in the agent's child and return its exit code; None when no usable agent answers."""
    if not enabled():
        return None
    path = socket_path()
    if private_dir_problem(path.parent) is not None:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        return None  # no agent for this code (never started, idled out, or started for older code)
    with conn:
        conn.settimeout(ANSWER_TIMEOUT_SECONDS)
        try:
            _send_request(conn, argv)
            kind, pid = _read_code(conn)
        except TimeoutError:
            # Not "run in-process": a child may yet start for this request. Closing makes one that does stop.
            print(
                f"relaunch: the agent at {path} did not answer within {ANSWER_TIMEOUT_SECONDS:.0f} s; "
                "run with RELAUNCH_AGENT=off, or `relaunch agent stop`",
                file=sys.stderr,
            )
            return LOST_EXIT_CODE
        except (OSError, ConnectionError):
            # Closed with no PID sent: the child sends its PID before anything else, so none runs for us.
            return None
        conn.settimeout(None)
        if kind != b"P":
            return None
        return _wait_for_child(conn, pid)


def _send_request(conn: socket.socket, argv: list[str]) -> None:
    request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "umask": _umask()}).encode()
    data = HEADER.pack(len(request)) + request
    sent = socket.send_fds(conn, [data[:65536]], [0, 1, 2])
    conn.sendall(data[sent:])


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _read_code(conn: socket.socket) -> tuple[bytes, int]:
    data = b""
    while len(data) < CODE.size:
        chunk = conn.recv(CODE.size - len(data))
        if not chunk:
            raise ConnectionError("the agent closed the connection")
        data += chunk
    kind, value = CODE.unpack(data)
    return kind, value


def _wait_for_child(conn: socket.socket, pid: int) -> int:
    """Forward the signals a terminal or a supervisor sends to the command; return its exit code."""

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, forward)
    try:
        kind, code = _read_code(conn)
    except (OSError, ConnectionError):
        kind, code = b"", LOST_EXIT_CODE
    if kind != b"X":
        print(
            f"relaunch: the agent's process for this command (PID {pid}) ended without an exit status; "
            f"see the agent's log in {agent_dir()} (`relaunch agent status`), or run with RELAUNCH_AGENT=off",
            file=sys.stderr,
        )
        return LOST_EXIT_CODE
    return code


# ---------------------------------------------------------------------------------------------
# `relaunch agent start|stop|status` (run in-process, never through an agent).

START_TIMEOUT_SECONDS = 120.0
MAX_SOCKET_PATH_BYTES = 107  # sun_path is 108 bytes with its final NUL
STOP_TIMEOUT_SECONDS = 30.0


class AgentError(Exception):
    """What `relaunch agent` could not do, and what to do about it."""


def ensure_private_dir(environ: os._Environ[str] | dict[str, str] = os.environ) -> Path:
    folder = agent_dir(environ)
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise AgentError(f"cannot make {folder}: {exc}") from exc
    problem = private_dir_problem(folder)
    if problem:
        raise AgentError(f"{problem}: the agent's socket must be reachable by you alone; remove it or `chmod 700 {folder}`")
    return folder


def answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _starttime(pid: int) -> str | None:
    """PID's start time, None for no such process or a zombie (as lib.sh's starttime: PIDs are reused)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def start(idle_seconds: float) -> str:
    """Start an agent for the code as it is now, unless one answers already; return what to tell the user."""
    import select
    import subprocess

    folder = ensure_private_dir()
    key = code_key()
    path, log = folder / f"{key}.sock", folder / f"{key}.log"
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise AgentError(
            f"the socket path {path} is {len(os.fsencode(path))} bytes, over the {MAX_SOCKET_PATH_BYTES} a Unix socket may have: "
            "set XDG_RUNTIME_DIR to a shorter folder"
        )
    if answers(path):
        return f"relaunch agent already running for this code: {path}"
    ready_r, ready_w = os.pipe()
    with open(log, "ab") as out:
        os.chmod(log, 0o600)
        process = subprocess.Popen(
            [sys.executable, "-m", "relaunch.cli.agent_server", "serve", str(path), str(idle_seconds), str(ready_w)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            pass_fds=(ready_w,),
            start_new_session=True,
            cwd="/",
        )
    os.close(ready_w)
    try:
        ready, _, _ = select.select([ready_r], [], [], START_TIMEOUT_SECONDS)
        said = os.read(ready_r, 64) if ready else b""
    finally:
        os.close(ready_r)
    if said != b"ready\n":
        code = process.poll()
        if code is None:
            process.kill()
            process.wait()
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise AgentError(f"the agent did not start (exit code {process.poll()}); the end of {log}:\n{tail}")
    (folder / f"{key}.pid").write_text(f"{process.pid} {_starttime(process.pid)} {install_key()}\n")
    return (
        f"relaunch agent running (PID {process.pid}): relaunch commands now start in a fraction of a second; "
        f"it stops after {idle_seconds / 60:.0f} idle minutes, or with `relaunch agent stop`. Log: {log}"
    )


def install_key(root: Path | None = None) -> str:
    """Which install of relaunch this is: its interpreter and the folder its code is in. One user may have several (two
    checkouts, a venv per project); each one's agents are its own: `relaunch agent stop` ends only those."""
    root = root or Path(__file__).resolve().parents[2]
    return hashlib.sha256(f"{sys.executable}\0{root}".encode()).hexdigest()[:16]


def recorded_agents(folder: Path) -> list[tuple[Path, int, bool]]:
    """Every agent recorded in FOLDER: (pid file, PID, whether that very process still runs)."""
    return [(pid_file, pid, running) for pid_file, pid, running, _ in _records(folder)]


def own_agents(folder: Path) -> tuple[list[tuple[Path, int, bool]], int]:
    """The agents of this install recorded in FOLDER, and how many live ones of other installs it holds beside them."""
    mine, others, key = [], 0, install_key()
    for pid_file, pid, running, install in _records(folder):
        if install == key or (install is None and _interpreter_of(pid) in (None, sys.executable)):
            mine.append((pid_file, pid, running))
        elif running:
            others += 1
    return mine, others


def _records(folder: Path) -> list[tuple[Path, int, bool, str | None]]:
    """(pid file, PID, still running, the install it was started by: None in a record from before installs were kept)."""
    found = []
    for pid_file in sorted(folder.glob("*.pid")):
        try:
            pid_text, started, *install = pid_file.read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            continue
        found.append((pid_file, pid, _starttime(pid) == started, install[0] if install else None))
    return found


def _interpreter_of(pid: int) -> str | None:
    """The interpreter a running agent was started with (its argv[0]: `start` runs sys.executable); None when unreadable."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode() or None
    except (OSError, UnicodeDecodeError):
        return None


def stop() -> str:
    """Stop every agent of this install and user by its recorded PID (and start time); wait until each is gone. Another
    install's agents (same uid, same folder) are left running, and said."""
    import time

    folder = agent_dir()
    if private_dir_problem(folder):
        return "no relaunch agent is running"
    stopped = []
    mine, others = own_agents(folder)
    left = f"; {others} agent(s) of another relaunch install left running (stop them with that install's relaunch)" if others else ""
    for pid_file, pid, running in mine:
        if running:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
            if not _wait_gone(pid, deadline):
                raise AgentError(f"agent PID {pid} did not stop within {STOP_TIMEOUT_SECONDS:.0f} s; it finishes running commands first")
            stopped.append(str(pid))
        pid_file.unlink(missing_ok=True)
    return (f"stopped relaunch agent(s): {', '.join(stopped)}" if stopped else "no relaunch agent of this install is running") + left


def _wait_gone(pid: int, deadline: float) -> bool:
    """Await the exit of a process that is not our child: its pidfd turns readable when it ends."""
    import select
    import time

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        return bool(ready)  # a pidfd is readable exactly when its process has ended (a zombie too)
    finally:
        os.close(fd)


def status() -> tuple[str, bool]:
    """What runs, and whether an agent serves the code as it is now."""
    folder = agent_dir()
    if private_dir_problem(folder):
        return "no relaunch agent is running", False
    key = code_key()
    lines, current = [], False
    mine, others = own_agents(folder)
    for pid_file, pid, running in mine:
        if not running:
            continue
        this_code = pid_file.stem == key and answers(folder / f"{key}.sock")
        current = current or this_code
        what = "serves the code as it is now" if this_code else "started for older code: commands run in-process (`relaunch agent stop`)"
        lines.append(f"agent PID {pid}: {what}; log {pid_file.with_suffix('.log')}")
    if others:
        lines.append(f"{others} agent(s) of another relaunch install (not this one's: it never uses or stops them)")
    return ("\n".join(lines) if lines else "no relaunch agent is running"), current
