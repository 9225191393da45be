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

This module's client half imports the standard library only: it runs before anything heavy is imported.
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
        for pattern in ("*.py", "cli/*.py", "flows/*.py", "tasks/*.py", "demo/*.py", "host/*.sh", "host/*.py"):
            files.extend(sorted(folder.glob(pattern)))
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
# The agent: `python -m relaunch.cli.agent serve SOCKET IDLE_SECONDS`, started by `relaunch agent start`.


def serve(path: Path, idle_seconds: float, ready_fd: int = -1) -> int:
    """Import what every command needs, then fork a child per connection until idle for IDLE_SECONDS.

    Single-threaded on purpose: a fork copies only the calling thread, so no lock of another thread can be
    held in a child. SIGCHLD wakes the loop through a pipe; a closed client is the child's business.
    """
    import gc
    import selectors
    import time

    from relaunch.cli import app as cli

    cli.prepare_environment()
    gc.disable()  # what imports allocate lives for good: collections during them free nothing (cli._import_flows)
    cli.import_all_flows()
    gc.freeze()
    gc.enable()
    listener = _listen(path)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stopping = {"now": False}
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stopping.update(now=True))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    last_active = time.monotonic()
    _log(f"agent {os.getpid()} serving {path} (stops after {idle_seconds:.0f} idle seconds)")
    if ready_fd >= 0:
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
    try:
        while not (stopping["now"] and not children):
            if not children and time.monotonic() - last_active > idle_seconds:
                _log("idle: stopping")
                break
            for key, _ in sel.select(timeout=1.0):
                if key.fileobj is listener and not stopping["now"]:
                    _accept(listener, children, wake_r)
                elif key.fileobj == wake_r:
                    os.read(wake_r, 4096)
            if stopping["now"] and listener.fileno() >= 0:
                # No new command while the running ones finish: a new client finds no socket and runs in-process.
                sel.unregister(listener)
                _unlink_if_ours(path, listener)
            _reap(children)
            if children:
                last_active = time.monotonic()
    finally:
        if listener.fileno() >= 0:
            _unlink_if_ours(path, listener)
    _log("stopped")
    return 0


def _listen(path: Path) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        if path.exists():
            path.unlink()  # a stale socket of a dead agent for this same code (start checked none answers)
        listener.bind(str(path))
    finally:
        os.umask(old)
    listener.listen(16)
    return listener


def _unlink_if_ours(path: Path, listener: socket.socket) -> None:
    # Only an agent for this very code binds this name, and `relaunch agent start` starts none beside a live one.
    try:
        path.unlink()
    except OSError:
        pass
    listener.close()


def _accept(listener: socket.socket, children: dict[int, socket.socket], wake_r: int) -> None:
    conn, _ = listener.accept()
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.getuid():
        _log(f"refused a connection from uid {uid}")
        conn.close()
        return
    conn.settimeout(REQUEST_TIMEOUT_SECONDS)
    try:
        request, fds = _read_request(conn)
        conn.settimeout(None)
    except EOFError:
        conn.close()
        return
    except (OSError, ValueError, ConnectionError) as exc:
        _log(f"bad request: {exc}")
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        listener.close()
        os.close(wake_r)
        for other in children.values():
            other.close()  # another command's connection: its client must see it close when that command ends
        _child(conn, request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    _log(f"child {pid}: {' '.join(request['argv'][:2])}")


def _read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
    if not data and not fds:
        raise EOFError("closed without a request (`relaunch agent status` asking whether one answers)")
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"expected 3 file descriptors, got {len(fds)}")
    while len(data) < HEADER.size:
        data += _recv_some(conn)
    (length,) = HEADER.unpack(data[: HEADER.size])
    body = data[HEADER.size :]
    while len(body) < length:
        body += _recv_some(conn)
    return json.loads(body[:length]), fds


def _recv_some(conn: socket.socket) -> bytes:
    chunk = conn.recv(65536)
    if not chunk:
        raise ConnectionError("the client closed the connection mid-request")
    return chunk


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        conn = children.pop(pid, None)
        if conn is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code  # killed by a signal: the shell's 128+N
        _log(f"child {pid} exited with {code}")
        try:
            conn.sendall(CODE.pack(b"X", code))
        except OSError:
            pass
        conn.close()


def _child(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: become the client's CLI process, then run the command."""
    import threading

    status = 70
    try:
        # First, before anything can act: a client that reads no PID knows that nothing ran for it.
        conn.sendall(CODE.pack(b"P", os.getpid()))
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        os.environ.clear()
        os.environ.update(request["env"])
        _reopen_stdio()
        threading.Thread(target=_leave_with_client, args=(conn,), daemon=True, name="relaunch-agent-client").start()
        from relaunch.cli import app as cli

        cli.run_forked(["relaunch", *request["argv"]])  # exits through cli._exit_now
    except BaseException:  # noqa: BLE001 - the child must never return into the agent's loop
        import traceback

        traceback.print_exc()
    finally:
        os._exit(status)


def _reopen_stdio() -> None:
    """New text streams on the client's descriptors, made as Python makes them: stdout line-buffered on a
    terminal, stderr always; the agent's own were its log file's."""
    import io

    for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        binary = io.open(fd, "rb" if fd == 0 else "wb", closefd=False)  # noqa: UP020 - a descriptor, not a path
        stream = io.TextIOWrapper(
            binary,
            encoding=getattr(old, "encoding", None) or "utf-8",
            errors="backslashreplace" if fd == 2 else getattr(old, "errors", None) or "strict",
            line_buffering=fd == 2 or (fd == 1 and os.isatty(fd)),
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _leave_with_client(conn: socket.socket) -> None:
    """The client closed its end (it was killed, its terminal went away): stop, as the CLI would have."""
    try:
        while conn.recv(4096):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def _log(message: str) -> None:
    import time

    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}", file=sys.stderr, flush=True)


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
            [sys.executable, "-m", "relaunch.cli.agent", "serve", str(path), str(idle_seconds), str(ready_w)],
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4 or args[0] != "serve":
        print("usage: python -m relaunch.cli.agent serve SOCKET IDLE_SECONDS READY_FD (`relaunch agent start` runs it)", file=sys.stderr)
        return 2
    return serve(Path(args[1]), float(args[2]), int(args[3]))


if __name__ == "__main__":
    sys.exit(main())
