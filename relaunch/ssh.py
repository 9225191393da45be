"""Commands on a remote host over SSH: one fabric Connection per host, opened lazily and reused.

Host keys are checked against known_hosts and unknown keys are refused unless the host opts
into trust-on-first-use; a changed key is never accepted. Failures of the wire become
TransportError (Prefect retries those); host-key and credential problems need a person.
"""

from __future__ import annotations

import codecs
import logging
import os
import re
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
from fabric import Config, Connection
from fabric.runners import Remote
from invoke.exceptions import CommandTimedOut, ThreadException

from relaunch.commands import HOST_TIMEOUT_GRACE_SECONDS, MAX_COMMAND_BYTES, Command, Result, host_argv, timed_out_on_host
from relaunch.config import Host
from relaunch.errors import AuthenticationFailed, CommandTooLong, HostKeyError, TransportError
from relaunch.transport import timeout_error

log = logging.getLogger(__name__)

PASSPHRASE_ENV = "RELAUNCH_SSH_PASSPHRASE"
KEEPALIVE_SECONDS = 30
# What a broken connection looks like from fabric/paramiko; ThreadException wraps errors in invoke's IO threads.
_WIRE_ERRORS = (paramiko.SSHException, EOFError, OSError, ThreadException)


class _Remote(Remote):
    """fabric's runner, with stdin closed and output decoded across read boundaries."""

    # invoke polls for the end of a command every input_sleep; its 10 ms default doubles a short command's round trip.
    input_sleep = 0.002
    killed = False

    def send_start_message(self, command: str) -> None:
        super().send_start_message(command)
        # Like LocalTransport's stdin=DEVNULL: a command that reads stdin sees EOF instead of hanging until the timeout.
        self.channel.shutdown_write()

    def read_proc_output(self, reader: Callable[[int], bytes]) -> Iterator[str]:
        # invoke decodes every chunk on its own, which mangles a UTF-8 character split between two reads.
        decoder = codecs.getincrementaldecoder(self.encoding)("replace")
        while data := reader(self.read_chunk_size):
            yield decoder.decode(data)
        if tail := decoder.decode(b"", final=True):
            yield tail

    def kill(self) -> None:
        self.killed = True
        super().kill()

    @property
    def timed_out(self) -> bool:
        # invoke's test is "the timer thread has ended", but the channel closes while that thread is still in
        # kill(), so a timed-out command could come back as an ordinary exit -1 instead of CommandTimedOut.
        return self.killed or super().timed_out


def _fabric_config() -> Config:
    # An explicit, empty SSH config and no invoke/fabric config files: the Host model is the only source
    # of truth (a ~/.ssh/config HostName or ProxyCommand must not silently redirect recovery commands).
    return Config(ssh_config=paramiko.SSHConfig(), lazy=True, overrides={"runners": {"remote": _Remote}})


class _RefuseUnknown(paramiko.MissingHostKeyPolicy):
    def __init__(self, host: Host, known_hosts: Path) -> None:
        self.host, self.known_hosts = host, known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        h = self.host
        raise HostKeyError(
            f"{h.user}@{h.hostname}:{h.port}: unknown host key {key.get_name()} {key.fingerprint} for {hostname}, "
            f"not in {self.known_hosts}; refusing to connect.\n"
            f"  what to do: check the fingerprint on the host itself (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then run "
            f"`ssh-keyscan -p {h.port} {shlex.quote(h.hostname)} >> {shlex.quote(str(self.known_hosts))}`, "
            f"or set trust_on_first_use: true to record the key on the first connection"
        )


class _TrustOnFirstUse(_RefuseUnknown):
    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        known = client.get_host_keys().lookup(hostname)
        if known:
            # Known under another key type: the server no longer offers the recorded key. Treat it as changed.
            h = self.host
            recorded = ", ".join(f"{k.get_name()} {k.fingerprint}" for k in known.values())
            raise HostKeyError(
                f"{h.user}@{h.hostname}:{h.port}: host key CHANGED for {hostname}: {self.known_hosts} records {recorded}, "
                f"the server offers only {key.get_name()} {key.fingerprint}. Possible man-in-the-middle; not accepted.\n"
                f"  what to do: {_changed_advice(hostname, self.known_hosts)}"
            )
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Append one line rather than paramiko's save_host_keys, which rewrites the file and drops comments.
        with open(self.known_hosts, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n".encode())
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning(
            "trust_on_first_use: recorded new host key %s %s for %s in %s", key.get_name(), key.fingerprint, hostname, self.known_hosts
        )


def _changed_advice(hostname: str, known_hosts: Path) -> str:
    return (
        "confirm the new key on the host itself (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub); only if it matches, "
        f"remove the old entry with `ssh-keygen -R {shlex.quote(hostname)} -f {shlex.quote(str(known_hosts))}` and add the new one"
    )


class SSHTransport:
    """Runs commands on `host` over one SSH connection, reconnecting after it drops."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._pkey: paramiko.PKey | None = None

    @property
    def _where(self) -> str:
        return f"{self.host.user}@{self.host.hostname}:{self.host.port}"

    @property
    def known_hosts_path(self) -> Path:
        return Path(os.path.expanduser(self.host.known_hosts_path or "~/.ssh/known_hosts"))

    def execute(self, command: Command) -> Result:
        timeout = command.timeout_seconds or self.host.command_timeout_seconds
        remote = shlex.join(host_argv(command, self.host.container, timeout))
        if len(remote.encode()) > MAX_COMMAND_BYTES:
            raise CommandTooLong(
                f"`{command.display}` is {len(remote.encode())} bytes quoted; the limit is {MAX_COMMAND_BYTES}: send large data as a file"
            )
        conn = self._connection(command)
        start = time.monotonic()
        try:
            # The host's `timeout` stops the command; the client's limit only catches a host that stopped answering.
            out = conn.run(
                remote, hide=True, warn=True, in_stream=False, pty=False, timeout=timeout + HOST_TIMEOUT_GRACE_SECONDS, encoding="utf-8"
            )
        except CommandTimedOut as exc:
            raise timeout_error(self.host.label, command, timeout) from exc
        except _WIRE_ERRORS as exc:
            self._discard(conn)
            raise TransportError(
                self.host.label,
                command.display,
                f"connection lost: {_reason(exc)}",
                "retried automatically; if it persists check that the host is up and sshd is running",
            ) from exc
        elapsed = time.monotonic() - start
        # paramiko reports -1 when the channel closed without an exit status: the connection died mid-command
        # (or the command was killed by a signal, which paramiko cannot tell us; then the connection is still fine).
        if out.exited == -1 and _is_dead(conn):
            self._discard(conn)
            raise TransportError(
                self.host.label,
                command.display,
                "connection dropped while the command ran; it may or may not have finished",
                "retried automatically; check the host if it keeps happening",
            )
        result = Result(out.exited, out.stdout, out.stderr, elapsed)
        if timed_out_on_host(result, timeout):
            raise timeout_error(self.host.label, command, timeout)
        return result

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                _close_quietly(self._conn)
                self._conn = None

    @property
    def connection(self) -> Connection | None:
        """The current connection, if one is open (for tests and diagnostics)."""
        return self._conn

    def _connection(self, command: Command) -> Connection:
        with self._lock:
            if self._conn is not None and not self._conn.is_connected:
                # Found dead before anything was sent (sshd restarted, idle socket reset): reconnect transparently.
                log.info("connection to %s was closed; reconnecting", self._where)
                _close_quietly(self._conn)
                self._conn = None
            if self._conn is None:
                self._conn = self._open(command)
            return self._conn

    def _discard(self, conn: Connection) -> None:
        with self._lock:
            if self._conn is conn:
                self._conn = None
        _close_quietly(conn)

    def _open(self, command: Command) -> Connection:
        h = self.host
        t = h.connect_timeout_seconds
        # timeout goes in connect_kwargs: fabric's own connect_timeout is int()-ed, so 0.5 would mean "no timeout".
        kwargs: dict[str, object] = dict(timeout=t, banner_timeout=t, auth_timeout=t, channel_timeout=t)
        if h.key_path:
            kwargs.update(pkey=self._private_key(), allow_agent=False, look_for_keys=False)
        conn = Connection(h.hostname, user=h.user, port=h.port, config=_fabric_config(), connect_kwargs=kwargs)
        known_hosts = self.known_hosts_path
        try:
            if known_hosts.exists():
                # Into the client's own table, not load_host_keys: that would let paramiko rewrite the file.
                conn.client.get_host_keys().load(str(known_hosts))
        except OSError as exc:
            raise HostKeyError(f"{self._where}: cannot read known_hosts {known_hosts}: {exc.strerror}") from exc
        except paramiko.hostkeys.InvalidHostKey as exc:
            # paramiko rejects the whole file over one bad line (OpenSSH would skip it): a person must fix it.
            raise HostKeyError(f"{self._where}: {known_hosts} has a malformed line, fix or remove it: {exc.line.strip()!r}") from exc
        # Replaces fabric's AutoAddPolicy, which would accept any key.
        policy = _TrustOnFirstUse if h.trust_on_first_use else _RefuseUnknown
        conn.client.set_missing_host_key_policy(policy(h, known_hosts))
        try:
            conn.open()
        except HostKeyError:
            _close_quietly(conn)
            raise
        except paramiko.BadHostKeyException as exc:
            _close_quietly(conn)
            raise HostKeyError(
                f"{self._where}: host key CHANGED for {exc.hostname}: {known_hosts} records "
                f"{exc.expected_key.get_name()} {exc.expected_key.fingerprint}, the server presented "
                f"{exc.key.get_name()} {exc.key.fingerprint}. Possible man-in-the-middle; not accepted "
                f"(trust_on_first_use never accepts a changed key).\n  what to do: {_changed_advice(exc.hostname, known_hosts)}"
            ) from None
        except paramiko.AuthenticationException as exc:
            _close_quietly(conn)
            key = f"key {h.key_path}" if h.key_path else "the ssh agent and default keys (no key_path set)"
            raise AuthenticationFailed(
                f"{self._where}: authentication failed with {key}: {_reason(exc)}\n"
                f"  what to do: make sure the matching public key is in {h.user}'s authorized_keys on the host and the user is right"
            ) from exc
        except TimeoutError as exc:
            _close_quietly(conn)
            raise TransportError(
                h.label,
                command.display,
                f"no answer from {h.hostname}:{h.port} within {t:g} s",
                "check that the host is up and reachable (network, firewall) and the port is right",
            ) from exc
        except socket.gaierror as exc:
            _close_quietly(conn)
            raise TransportError(h.label, command.display, f"cannot resolve {h.hostname}: {exc.strerror}", "check hostname") from exc
        except _WIRE_ERRORS as exc:
            _close_quietly(conn)
            raise TransportError(
                h.label,
                command.display,
                f"cannot connect: {_reason(exc)}",
                f"check that {h.hostname} is up and reachable, and that sshd listens on port {h.port}",
            ) from exc
        conn.transport.set_keepalive(KEEPALIVE_SECONDS)
        if isinstance(conn.transport.sock, socket.socket):
            # paramiko leaves Nagle on, so each channel open/exec waits out a delayed ACK (~40 ms per command on Linux).
            sock = conn.transport.sock
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # A host that vanishes mid-command must be noticed in seconds, not after TCP's ~15 minutes of
            # retries: probe an idle link and give up on unacknowledged data (paramiko's keepalive expects no reply).
            dead_after = max(1, int(h.connect_timeout_seconds))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, dead_after)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, dead_after)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 3 * dead_after * 1000)
        log.info("connected to %s", self._where)
        return conn

    def _private_key(self) -> paramiko.PKey:
        if self._pkey is not None:
            return self._pkey
        path = Path(os.path.expanduser(self.host.key_path or ""))
        where = f"{self._where}: private key {path}"
        try:
            self._pkey = paramiko.PKey.from_path(path)
            return self._pkey
        except TypeError:
            pass  # encrypted (cryptography says so with TypeError); only now is a passphrase needed
        except OSError as exc:
            raise AuthenticationFailed(f"{where}: cannot read it: {exc.strerror}") from exc
        except (ValueError, paramiko.SSHException) as exc:
            raise AuthenticationFailed(f"{where} is not a usable private key: {_reason(exc)}") from exc
        passphrase, source = self._passphrase()
        if passphrase is None:
            raise AuthenticationFailed(
                f"{where} is encrypted and no passphrase is configured\n"
                f"  what to do: set {PASSPHRASE_ENV} or the host's passphrase_secret_block"
            )
        try:
            self._pkey = paramiko.PKey.from_path(path, passphrase.encode())
        except (TypeError, ValueError, paramiko.SSHException):
            # from None: nothing from the decrypt attempt travels with the error.
            raise AuthenticationFailed(f"{where}: cannot decrypt it with the passphrase from {source} (wrong passphrase?)") from None
        return self._pkey

    def _passphrase(self) -> tuple[str | None, str]:
        if value := os.environ.get(PASSPHRASE_ENV):
            return value, f"${PASSPHRASE_ENV}"
        name = self.host.passphrase_secret_block
        if not name:
            return None, ""
        # Imported here: only hosts with an encrypted key need the Prefect API.
        from prefect.blocks.system import Secret

        try:
            value = Secret.load(name).get()
        except Exception as exc:
            raise AuthenticationFailed(f"{self._where}: cannot load Secret block {name!r}: {type(exc).__name__}") from None
        return str(value), f"Secret block {name!r}"


def _is_dead(conn: Connection) -> bool:
    t = conn.transport
    # saved_exception is set before the channels are closed, active only after: check both.
    return t is None or not t.is_active() or t.saved_exception is not None


def _close_quietly(conn: Connection) -> None:
    try:
        conn.close()
    except Exception:
        log.debug("error closing SSH connection", exc_info=True)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ThreadException) and exc.exceptions:
        exc = exc.exceptions[0].value
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        # paramiko folds the socket errors into "[Errno None]"; the first real one says what happened.
        first = next(iter(exc.errors.values()))
        return first.strerror or str(first)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


_CONTAINER_FAILURES = (
    (
        re.compile(r"Configuration file 'nodes/[^/]+/lxc/(?P<id>[^.']+)\.conf' does not exist"),
        "LXC container {id} does not exist on this node (check the container id, or `pct list`)",
    ),
    (
        re.compile(r"lxc-attach: (?P<id>\S+): .*[Ff]ailed to get (?:the )?init pid"),
        "LXC container {id} is not running (start it with `pct start {id}`)",
    ),
    (
        re.compile(r"Error response from daemon: No such container: (?P<id>\S+)"),
        "docker container {id} does not exist (check the name, or `docker ps -a`)",
    ),
    (
        re.compile(r"Error response from daemon: [Cc]ontainer (?P<id>\S+) is not running"),
        "docker container {id} is not running (start it with `docker start`)",
    ),
    (re.compile(r"(?P<id>pct|docker): command not found"), "{id} is not installed on the host (or not on PATH)"),
)


def describe_container_failure(result: Result) -> str | None:
    """A short explanation when a failed command never reached its container, else None."""
    if result.exit_code == 0:
        return None
    for pattern, text in _CONTAINER_FAILURES:
        if m := pattern.search(result.stderr):
            return text.format(id=m.group("id"))
    return None
