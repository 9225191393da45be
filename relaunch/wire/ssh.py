"""Commands on a remote host over SSH: one fabric Connection per host, opened lazily and reused.

A host behind jump hosts is reached hop by hop through fabric's gateways (a direct-tcpip tunnel
from each hop to the next). Host keys are checked against known_hosts on every hop and unknown
keys are refused unless that hop opts into trust-on-first-use; a changed key is never accepted.
A private key comes from a file or, held in memory only, from a Prefect Secret block; its passphrase from the hop's
own Secret block, then the one variable every key may share. With `ssh_config: true` the host is an alias that
~/.ssh/config resolves (relaunch/wire/sshconfig.py), and ssh-agent's keys are offered too. Failures of
the wire become TransportError (Prefect retries those), except a host this process never reached that cannot be
connected to (HostUnreachable.first_contact: refused, no answer, no such name), which is said at once; host-key and
credential problems need a person.
"""

from __future__ import annotations

import codecs
import functools
import io
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import overload

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from fabric import Config, Connection
from fabric.runners import Remote
from invoke.exceptions import CommandTimedOut, ThreadException

from relaunch.config import Host, JumpHost, SSHLogin
from relaunch.errors import AuthenticationFailed, CommandTooLong, HostKeyError, HostUnreachable, RelaunchError, Result, TransportError
from relaunch.wire.commands import HOST_TIMEOUT_GRACE_SECONDS, MAX_COMMAND_BYTES, Command, host_argv, timed_out_on_host
from relaunch.wire.sshconfig import passphrase_block, resolve

# Reads a Prefect Secret block by name (tasks/secrets.py): set from above, so that the core imports no Prefect.
SecretLoader = Callable[[str], str]
_secret_loader: SecretLoader | None = None


def use_secret_loader(loader: SecretLoader) -> None:
    """Where keys and passphrases kept in Secret blocks are read from (the tasks and the command set Prefect's)."""
    global _secret_loader
    _secret_loader = loader


log = logging.getLogger(__name__)

PASSPHRASE_ENV = "RELAUNCH_SSH_PASSPHRASE"
KEEPALIVE_SECONDS = 30
# What a broken connection looks like from fabric/paramiko; ThreadException wraps errors in invoke's IO threads.
_WIRE_ERRORS = (paramiko.SSHException, EOFError, OSError, ThreadException)


class _Remote(Remote):
    """fabric's runner, with output decoded across read boundaries."""

    # invoke polls for the end of a command every input_sleep; its 10 ms default doubles a short command's round trip.
    input_sleep = 0.002
    killed = False

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
    # of truth (a ~/.ssh/config HostName or ProxyCommand must not silently redirect recovery commands). A host that
    # opts in (ssh_config: true) has its config read into that model first, by relaunch/wire/sshconfig.py, in the open.
    return Config(ssh_config=paramiko.SSHConfig(), lazy=True, overrides={"runners": {"remote": _Remote}})


class _Hop:
    """One SSH server on the way to the host: a jump host, or the host itself (the last hop)."""

    def __init__(self, login: SSHLogin, where: str, reached_from: JumpHost | None) -> None:
        self.login, self.where, self.reached_from = login, where, reached_from

    @property
    def is_jump(self) -> bool:
        return isinstance(self.login, JumpHost)

    @property
    def known_hosts(self) -> Path:
        return Path(os.path.expanduser(self.login.known_hosts_path or "~/.ssh/known_hosts"))

    @property
    def known_hosts_name(self) -> str:
        """The name known_hosts records this hop under, as OpenSSH and paramiko write it."""
        return self.login.hostname if self.login.port == 22 else f"[{self.login.hostname}]:{self.login.port}"

    def scan_advice(self) -> str:
        scan = f"ssh-keyscan -p {self.login.port} {shlex.quote(self.login.hostname)}"
        if self.reached_from is None:
            return f"run `{scan} >> {shlex.quote(str(self.known_hosts))}`"
        # Only the jump host before it can reach this hop, so the scan has to run there.
        return f"run `{scan}` on {self.reached_from.address} (this hop is reachable only from there) and append its output to {self.known_hosts}"

    def reach_advice(self) -> str:
        seen_from = f" from {self.reached_from.address}" if self.reached_from else ""
        return f"check that {self.login.hostname} is up and reachable{seen_from}, and that sshd listens on port {self.login.port}"


def _route(host: Host) -> list[_Hop]:
    """The jump hosts in order, then the host: each hop is reached through the one before it."""
    hops: list[_Hop] = []
    before: JumpHost | None = None
    for i, jump in enumerate(host.jump, 1):
        hops.append(_Hop(jump, f"jump host {jump.address} (hop {i} of {len(host.jump)} on the way to {host.address})", before))
        before = jump
    hops.append(_Hop(host, host.route, before))
    return hops


class _RefuseUnknown(paramiko.MissingHostKeyPolicy):
    def __init__(self, hop: _Hop) -> None:
        self.hop = hop

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        on_this = " on this jump host" if self.hop.is_jump else ""
        raise HostKeyError(
            f"{self.hop.where}: unknown host key {key.get_name()} {key.fingerprint} for {hostname}, "
            f"not in {self.hop.known_hosts}; refusing to connect.\n"
            f"  what to do: check the fingerprint on the host itself (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then "
            f"{self.hop.scan_advice()}, or set trust_on_first_use: true{on_this} to record the key on the first connection"
        )


class _TrustOnFirstUse(_RefuseUnknown):
    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        known_hosts = self.hop.known_hosts
        known = client.get_host_keys().lookup(hostname)
        if known:
            # Known under another key type: the server no longer offers the recorded key. Treat it as changed.
            recorded = ", ".join(f"{k.get_name()} {k.fingerprint}" for k in known.values())
            raise HostKeyError(
                f"{self.hop.where}: host key CHANGED for {hostname}: {known_hosts} records {recorded}, "
                f"the server offers only {key.get_name()} {key.fingerprint}. Possible man-in-the-middle; not accepted.\n"
                f"  what to do: {_changed_advice(hostname, known_hosts)}"
            )
        known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Append one line rather than paramiko's save_host_keys, which rewrites the file and drops comments.
        with open(known_hosts, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n".encode())
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning(
            "trust_on_first_use: recorded new host key %s %s for %s (%s) in %s",
            key.get_name(),
            key.fingerprint,
            hostname,
            self.hop.where,
            known_hosts,
        )


def _changed_advice(hostname: str, known_hosts: Path) -> str:
    return (
        "confirm the new key on the host itself (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub); only if it matches, "
        f"remove the old entry with `ssh-keygen -R {shlex.quote(hostname)} -f {shlex.quote(str(known_hosts))}` and add the new one"
    )


class _TunnelFailed(Exception):
    """The jump host before this hop could not open the tunnel (direct-tcpip channel) to it."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(_reason(cause))
        self.cause = cause


class _Connection(Connection):
    """fabric's Connection; a failure to open the tunnel through the gateway is told apart from the hop's own handshake."""

    def open_gateway(self) -> paramiko.Channel:
        try:
            return super().open_gateway()
        except _WIRE_ERRORS as exc:
            raise _TunnelFailed(exc) from exc


# The key types paramiko can sign with, by the class cryptography loads them as (as PKey.from_path picks them).
_KEY_CLASSES: tuple[tuple[type, type[paramiko.PKey]], ...] = (
    (rsa.RSAPrivateKey, paramiko.RSAKey),
    (ed25519.Ed25519PrivateKey, paramiko.Ed25519Key),
    (ec.EllipticCurvePrivateKey, paramiko.ECDSAKey),
)


def _key_from_text(text: str, password: bytes | None) -> paramiko.PKey:
    """A private key from its text, in memory only. Raises like PKey.from_path: TypeError when it is encrypted and
    no password is given, ValueError (or SSHException) when the password is wrong or the text is not a key."""
    data = text.encode()
    try:
        loaded = serialization.load_ssh_private_key(data, password=password)
    except ValueError:
        loaded = serialization.load_pem_private_key(data, password=password)
    for crypto_class, key_class in _KEY_CLASSES:
        if isinstance(loaded, crypto_class):
            return key_class.from_private_key(io.StringIO(text), password=password)
    raise ValueError(f"unsupported key type {type(loaded).__name__}")


class SSHTransport:
    """Runs commands on `host` over one SSH connection (through its jump hosts, if any), reconnecting after it drops."""

    def __init__(self, host: Host) -> None:
        # With ssh_config on, the alias becomes what ~/.ssh/config makes of it (HostName, User, ProxyJump, ...).
        resolved = resolve(host)
        self.host = resolved.host
        self._aliases = resolved.aliases  # by hop, for the per-host passphrase block; empty without ssh_config
        self._route = _route(self.host)
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._pkeys: dict[int, paramiko.PKey] = {}  # by hop: each is loaded (and decrypted) once
        # Whether this transport ever reached the host: until then a host that cannot be connected to is an answer, not
        # a fault of the wire (HostUnreachable.first_contact: said at once, not retried).
        self.reached_once = False

    @property
    def known_hosts_path(self) -> Path:
        return self._route[-1].known_hosts

    def execute(self, command: Command) -> Result:
        timeout = command.timeout_seconds or self.host.command_timeout_seconds
        # stdin is /dev/null on the host (like LocalTransport's stdin=DEVNULL: a command that reads it sees EOF at once).
        # Not an EOF sent on the channel: a fast command's channel may already be freed by sshd when it arrives, and
        # OpenSSH then drops the whole connection ("ieof packet referred to nonexistent channel"), every command on it too.
        remote = shlex.join(host_argv(command, self.host.container, timeout)) + " < /dev/null"
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
            raise TransportError.timed_out(self.host.label, command.display, timeout) from exc
        except _WIRE_ERRORS as exc:
            self._discard(conn)
            raise TransportError(
                self.host.label,
                command.display,
                f"connection lost: {_reason(exc)}",
                f"retried automatically; if it persists check that the host{' and its jump hosts' if self.host.jump else ''} "
                "are up and sshd is running",
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
            raise TransportError.timed_out(self.host.label, command.display, timeout)
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
                log.info("connection to %s was closed; reconnecting", self.host.route)
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

    def reach(self) -> list[tuple[str, RelaunchError | None]]:
        """Open the route hop by hop, as the first command would, and say how far it got: (where, None) for each hop
        reached and, when one failed, (where, its error) last; the hops behind it are never tried. The connection is
        kept for the commands after (`relaunch doctor`)."""
        reached: list[_Hop] = []
        with self._lock:
            if self._conn is None or not self._conn.is_connected:
                try:
                    self._conn = self._open(Command(("true",), label="ssh connect"), reached.append)
                except RelaunchError as exc:
                    self._conn = None
                    return [(hop.where, None) for hop in reached] + [(self._route[len(reached)].where, exc)]
        return [(hop.where, None) for hop in self._route]

    def _open(self, command: Command, reached: Callable[[_Hop], object] | None = None) -> Connection:
        # Hop by hop, each through the one before, so a failure is named by the hop it happened on; a jump host that
        # dropped is never reopened on its own: the whole route is built again.
        conn: Connection | None = None
        try:
            for i, hop in enumerate(self._route):
                conn = self._open_hop(i, hop, conn, command)
                if reached:
                    reached(hop)
        except BaseException:
            if conn is not None:
                _close_quietly(conn)
            raise
        log.info("connected to %s", self.host.route)
        assert conn is not None  # the route always ends with the host
        self.reached_once = True
        return conn

    def _open_hop(self, i: int, hop: _Hop, gateway: Connection | None, command: Command) -> Connection:
        login, t = hop.login, self.host.connect_timeout_seconds
        # timeout goes in connect_kwargs: fabric's own connect_timeout is int()-ed, so 0.5 would mean "no timeout".
        # channel_timeout also bounds the tunnel a jump host opens to the next hop.
        kwargs: dict[str, object] = dict(timeout=t, banner_timeout=t, auth_timeout=t, channel_timeout=t)
        if login.key_path or login.key_secret_block:
            # As OpenSSH does, a host from ~/.ssh/config may also be let in by a key of ssh-agent's.
            kwargs.update(pkey=self._private_key(i, hop), allow_agent=self.host.ssh_config, look_for_keys=False)
        conn = _Connection(
            login.hostname, user=login.user, port=login.port, config=_fabric_config(), connect_kwargs=kwargs, gateway=gateway
        )
        known_hosts = hop.known_hosts
        try:
            if known_hosts.exists():
                # Into the client's own table, not load_host_keys: that would let paramiko rewrite the file.
                conn.client.get_host_keys().load(str(known_hosts))
        except OSError as exc:
            raise HostKeyError(f"{hop.where}: cannot read known_hosts {known_hosts}: {exc.strerror}") from exc
        except paramiko.hostkeys.InvalidHostKey as exc:
            # paramiko rejects the whole file over one bad line (OpenSSH would skip it): a person must fix it.
            raise HostKeyError(f"{hop.where}: {known_hosts} has a malformed line, fix or remove it: {exc.line.strip()!r}") from exc
        # Replaces fabric's AutoAddPolicy, which would accept any key: every hop is checked, not only the last.
        policy = _TrustOnFirstUse if login.trust_on_first_use else _RefuseUnknown
        conn.client.set_missing_host_key_policy(policy(hop))
        try:
            conn.open()
        except HostKeyError:
            _close_quietly(conn)
            raise
        except _TunnelFailed as exc:
            _close_quietly(conn)
            assert hop.reached_from is not None  # only a hop behind a jump host has a tunnel
            raise HostUnreachable(
                self.host.label,
                command.display,
                f"jump host {hop.reached_from.address} cannot open a tunnel to {login.hostname}:{login.port}: {exc}",
                f"{hop.reach_advice()} (the jump host's sshd must allow TCP forwarding: AllowTcpForwarding yes)",
                first_contact=not self.reached_once,
            ) from exc.cause
        except paramiko.BadHostKeyException as exc:
            _close_quietly(conn)
            # paramiko names the bare hostname; known_hosts (and so `ssh-keygen -R`) names [host]:port off port 22.
            name = hop.known_hosts_name
            raise HostKeyError(
                f"{hop.where}: host key CHANGED for {name}: {known_hosts} records "
                f"{exc.expected_key.get_name()} {exc.expected_key.fingerprint}, the server presented "
                f"{exc.key.get_name()} {exc.key.fingerprint}. Possible man-in-the-middle; not accepted "
                f"(trust_on_first_use never accepts a changed key).\n  what to do: {_changed_advice(name, known_hosts)}"
            ) from None
        except paramiko.AuthenticationException as exc:
            _close_quietly(conn)
            raise AuthenticationFailed(
                f"{hop.where}: authentication failed with {_key_source(login)}: {_reason(exc)}\n"
                f"  what to do: make sure the matching public key is in {login.user}'s authorized_keys on {login.hostname} "
                "and the user is right"
            ) from exc
        except TimeoutError as exc:
            _close_quietly(conn)
            raise HostUnreachable(
                self.host.label,
                command.display,
                f"no answer from {hop.where} within {t:g} s",
                f"{hop.reach_advice()} (network, firewall)",
                first_contact=not self.reached_once,
            ) from exc
        except socket.gaierror as exc:
            _close_quietly(conn)
            raise HostUnreachable(
                self.host.label,
                command.display,
                f"cannot resolve {login.hostname} ({hop.where}): {exc.strerror}",
                "check hostname",
                first_contact=not self.reached_once,
            ) from exc
        except _WIRE_ERRORS as exc:
            _close_quietly(conn)
            raise HostUnreachable(
                self.host.label,
                command.display,
                f"cannot connect to {hop.where}: {_reason(exc)}",
                hop.reach_advice(),
                first_contact=not self.reached_once,
            ) from exc
        conn.transport.set_keepalive(KEEPALIVE_SECONDS)
        if isinstance(conn.transport.sock, socket.socket):
            # Only the first hop has a socket of its own; the later ones ride on it through tunnels.
            # paramiko leaves Nagle on, so each channel open/exec waits out a delayed ACK (~40 ms per command on Linux).
            sock = conn.transport.sock
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # A host that vanishes mid-command must be noticed in seconds, not after TCP's ~15 minutes of
            # retries: probe an idle link and give up on unacknowledged data (paramiko's keepalive expects no reply).
            dead_after = max(1, int(t))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, dead_after)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, dead_after)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 3 * dead_after * 1000)
        if hop.is_jump:
            log.info("connected to %s", hop.where)
        return conn

    def _private_key(self, i: int, hop: _Hop) -> paramiko.PKey:
        if i in self._pkeys:
            return self._pkeys[i]
        login = hop.login
        load: Callable[[bytes | None], paramiko.PKey]
        if login.key_secret_block:
            text = self._secret(login.key_secret_block, hop)
            where = f"{hop.where}: private key from Secret block {login.key_secret_block!r}"
            load = functools.partial(_key_from_text, text)
        else:
            path = Path(os.path.expanduser(login.key_path or ""))
            where = f"{hop.where}: private key {path}"
            load = functools.partial(paramiko.PKey.from_path, path)
        try:
            self._pkeys[i] = load(None)
            return self._pkeys[i]
        except TypeError:
            pass  # encrypted (cryptography says so with TypeError); only now is a passphrase needed
        except OSError as exc:
            raise AuthenticationFailed(f"{where}: cannot read it: {exc.strerror}") from exc
        except (ValueError, paramiko.SSHException) as exc:
            # Only the error's type: nothing parsed out of the key text travels with the error.
            raise AuthenticationFailed(
                f"{where} is not a usable private key ({type(exc).__name__}); it must be an unencrypted or passphrase-protected "
                "OpenSSH or PEM key (RSA, ECDSA or Ed25519)"
            ) from None
        passphrase, source = self._passphrase(i, hop)
        if passphrase is None:
            raise AuthenticationFailed(
                f"{where} is encrypted and no passphrase is configured\n"
                f"  what to do: set {PASSPHRASE_ENV} or passphrase_secret_block next to the key"
                + (f", or create the Secret block {passphrase_block(self._aliases[i])!r}" if self._aliases else "")
            )
        try:
            self._pkeys[i] = load(passphrase.encode())
        except (TypeError, ValueError, paramiko.SSHException):
            # from None: nothing from the decrypt attempt travels with the error.
            raise AuthenticationFailed(
                f"{where}: cannot decrypt it with the passphrase from {source} (wrong passphrase?)\n"
                f"  what to do: put the key's passphrase in {source}"
            ) from None
        return self._pkeys[i]

    def _passphrase(self, i: int, hop: _Hop) -> tuple[str | None, str]:
        """The key's own passphrase first (its hop's block, or the block named after its ~/.ssh/config alias), then the
        one variable every key may share."""
        if name := hop.login.passphrase_secret_block:
            return self._secret(name, hop), f"Secret block {name!r}"
        if self._aliases:
            name = passphrase_block(self._aliases[i])
            if (value := self._secret(name, hop, missing_ok=True)) is not None:
                return value, f"Secret block {name!r}"
        if value := os.environ.get(PASSPHRASE_ENV):
            return value, f"${PASSPHRASE_ENV}"
        return None, ""

    @overload
    def _secret(self, name: str, hop: _Hop) -> str: ...
    @overload
    def _secret(self, name: str, hop: _Hop, missing_ok: bool) -> str | None: ...

    def _secret(self, name: str, hop: _Hop, missing_ok: bool = False) -> str | None:
        if _secret_loader is None:
            raise AuthenticationFailed(
                f"{hop.where}: Secret block {name!r} cannot be read here: no loader of Prefect Secret blocks was set\n"
                "  what to do: run through the relaunch command or a flow (they set it), or call relaunch.wire.ssh.use_secret_loader"
            )
        try:
            value = _secret_loader(name)
        except Exception as exc:
            # Prefect says "Unable to find block document named ..." (a ValueError): a per-host block is optional.
            if missing_ok and isinstance(exc, ValueError) and "Unable to find block document" in str(exc):
                return None
            # Only the error's type: a block's text must never reach an error, whatever went wrong with it.
            raise AuthenticationFailed(
                f"{hop.where}: cannot load Secret block {name!r}: {type(exc).__name__}\n"
                f"  what to do: create the Secret block {name!r} on the Prefect server this worker uses (PREFECT_API_URL), or fix the name"
            ) from None
        return str(value)


def _key_source(login: SSHLogin) -> str:
    if login.key_secret_block:
        return f"the key from Secret block {login.key_secret_block!r}"
    return f"key {login.key_path}" if login.key_path else "the ssh agent and default keys (no key_path set)"


def _is_dead(conn: Connection) -> bool:
    t = conn.transport
    # saved_exception is set before the channels are closed, active only after: check both.
    return t is None or not t.is_active() or t.saved_exception is not None


def _close_quietly(conn: Connection) -> None:
    """The connection, then each jump host it was tunnelled through: a route is closed as a whole."""
    hop: Connection | None = conn
    while isinstance(hop, Connection):
        try:
            hop.close()
        except Exception:
            log.debug("error closing SSH connection", exc_info=True)
        hop = hop.gateway


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ThreadException) and exc.exceptions:
        exc = exc.exceptions[0].value
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        # paramiko folds the socket errors into "[Errno None]"; the first real one says what happened.
        first = next(iter(exc.errors.values()))
        return first.strerror or str(first)
    if isinstance(exc, paramiko.ChannelException):
        return f"{exc.text} (channel open failure {exc.code})"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
