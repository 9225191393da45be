"""The warm agent's own process (relaunch/cli/agent.py says what it is for, and holds the client and its management):
`python -m relaunch.cli.agent_server serve SOCKET IDLE_SECONDS READY_FD`, started by `relaunch agent start`. It
imports what every command needs once, then forks a child per connection that runs the command as relaunch's own
process would (relaunch/cli/startup.py's `run_forked`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

from relaunch.cli import startup
from relaunch.cli.agent import CODE, HEADER, REQUEST_TIMEOUT_SECONDS


def serve(path: Path, idle_seconds: float, ready_fd: int = -1) -> int:
    """Import what every command needs, then fork a child per connection until idle for IDLE_SECONDS.

    Single-threaded on purpose: a fork copies only the calling thread, so no lock of another thread can be
    held in a child. SIGCHLD wakes the loop through a pipe; a closed client is the child's business.
    """
    import gc
    import selectors
    import time

    startup.prepare_environment()
    gc.disable()  # what imports allocate lives for good: collections during them free nothing (startup._import_flows)
    startup.import_all_flows()
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
        startup.run_forked(["relaunch", *request["argv"]])  # exits through startup._exit_now
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4 or args[0] != "serve":
        print(
            "usage: python -m relaunch.cli.agent_server serve SOCKET IDLE_SECONDS READY_FD (`relaunch agent start` runs it)",
            file=sys.stderr,
        )
        return 2
    return serve(Path(args[1]), float(args[2]), int(args[3]))


if __name__ == "__main__":
    sys.exit(main())
