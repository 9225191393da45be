"""A real OpenSSH server for tests: 127.0.0.1, a free port, its own host key and user key.

    with running_sshd() as server:
        transport = SSHTransport(server.ssh_host())

Sessions get relaunch/testing/bin first on PATH (sshd_config SetEnv, OpenSSH >= 7.8), so `pct` and
`docker` resolve to the stand-ins, which read the container states from `server.containers_file`.
SHLVL=1 keeps Debian's bash from sourcing the user's ~/.bashrc for ssh commands (it does when
SHLVL is unset), so the tests do not depend on, or pay for, this machine's shell start-up files.
`server.restart()` stops the listener and every connection, then listens again on the same port.
`SSHServer(..., netns=NAME, hostname=ADDRESS)` runs sshd inside network namespace NAME (`ip netns exec`),
listening on that namespace's ADDRESS; `env` adds variables to every session's environment. A server this
machine cannot reach (`reachable_from_here=False`, a host behind a bastion) is ready once sshd logs that it listens.
`server.jump_host()` is the server as a jump host (`Host.jump`) on the way to another.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest

from relaunch.config import Container, Host, JumpHost

SSHD = "/usr/sbin/sshd"
BIN = Path(__file__).resolve().parent / "bin"  # relaunch/testing/bin: the fake pct and docker
READY_TIMEOUT = 10.0


def in_ci() -> bool:
    """CI=true (or any value but empty, 0, false, no): the run must not silently drop a test."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def cannot_run_here(reason: str) -> NoReturn:
    """The one way a test gives up for want of something on this machine: a skip with the reason on a
    developer machine, a failure with the same reason in CI (a CI run must not drop a fault-matrix row)."""
    if in_ci():
        pytest.fail(f"{reason} (CI={os.environ['CI']}: failing instead of skipping)", pytrace=False)
    pytest.skip(reason)


def require_sshd() -> None:
    """Skip when there is no sshd on a developer machine; in CI a missing sshd is a failure."""
    if os.path.exists(SSHD) and shutil.which("ssh-keygen"):
        return
    cannot_run_here(f"{SSHD} or ssh-keygen missing; install it: apt-get update && apt-get install -y openssh-server")


def keygen(path: Path, passphrase: str = "", comment: str = "relaunch-test") -> Path:
    """A new ed25519 key pair at path (private) and path.pub."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", comment, "-f", str(path)], check=True)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _process_tree(root: int) -> list[list[int]]:
    """root's descendants by generation, read from /proc: sshd's per-connection processes outlive the listener."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    generations, current = [], [root]
    while current := [p for p, pp in parents.items() if pp in current]:
        generations.append(current)
    return generations


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@dataclass
class SSHServer:
    workdir: Path
    port: int = field(default_factory=free_port)
    user: str = field(default_factory=getpass.getuser)
    hostname: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = None
    netns: str | None = None  # run sshd inside this network namespace (`ip netns exec NAME`)
    env: dict[str, str] = field(default_factory=dict)  # more variables for every session (SetEnv)
    reachable_from_here: bool = True  # False: only another namespace routes to it, so readiness is read from sshd's log
    bin_first: Path | None = None  # stand-ins before relaunch/testing/bin on every session's PATH (a GPU host's nvidia-smi, dmesg)

    def __post_init__(self) -> None:
        self.host_key = keygen(self.workdir / "ssh_host_ed25519_key")
        self.key_path = keygen(self.workdir / "id_user")
        self.authorized_keys = self.workdir / "authorized_keys"
        self.authorized_keys.write_text((self.workdir / "id_user.pub").read_text())
        self.known_hosts_path = self.workdir / "known_hosts"
        self.known_hosts_path.write_text(self.known_hosts_line())
        self.containers_file = self.workdir / "containers"
        self.set_containers(running=["201", "trainer"], stopped=["202", "stopped-trainer"])
        self.log_path = self.workdir / "sshd.log"
        self.config_path = self.workdir / "sshd_config"
        # The test venv's bin last: it is where this machine's uv lives, as /usr/local/bin would on a GPU host.
        first = f"{self.bin_first}:" if self.bin_first else ""
        path = f"{first}{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:{Path(sys.executable).parent}"
        extra = "".join(f' "{k}={v}"' for k, v in self.env.items())
        self.config_path.write_text(
            f"""\
Port {self.port}
ListenAddress {self.hostname}
HostKey {self.host_key}
PidFile {self.workdir / "sshd.pid"}
AuthorizedKeysFile {self.authorized_keys}
StrictModes no
UsePAM no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitUserEnvironment no
UseDNS no
X11Forwarding no
MaxSessions 64
MaxStartups 64
LogLevel INFO
SetEnv "PATH={path}" "RELAUNCH_FAKE_CONTAINERS_FILE={self.containers_file}" SHLVL=1{extra}
"""
        )

    @property
    def address(self) -> str:
        """The name known_hosts uses for this server."""
        return f"[{self.hostname}]:{self.port}"

    def known_hosts_line(self, public_key: Path | None = None) -> str:
        kind, b64 = (public_key or self.host_key.with_suffix(".pub")).read_text().split()[:2]
        return f"{self.address} {kind} {b64}\n"

    def ssh_host(self, **overrides: object) -> Host:
        values: dict[str, object] = dict(
            kind="ssh",
            hostname=self.hostname,
            port=self.port,
            user=self.user,
            key_path=str(self.key_path),
            known_hosts_path=str(self.known_hosts_path),
            connect_timeout_seconds=5.0,
            command_timeout_seconds=30.0,
        )
        values.update(overrides)
        return Host.model_validate(values)

    def jump_host(self, **overrides: object) -> JumpHost:
        """This server as a jump host on the way to another: its address, user, key and known_hosts."""
        login = self.ssh_host().model_dump(include=set(JumpHost.model_fields))
        return JumpHost.model_validate({**login, **overrides})

    def container_host(self, kind: str, id: str, **overrides: object) -> Host:
        return self.ssh_host(container=Container(kind=kind, id=id), **overrides)  # type: ignore[arg-type]

    def authorize(self, key_path: Path) -> None:
        with self.authorized_keys.open("a") as f:
            f.write(key_path.with_name(key_path.name + ".pub").read_text())

    def set_containers(self, running: list[str] = [], stopped: list[str] = []) -> None:  # noqa: B006 (never mutated)
        lines = [f"{c}\n" for c in running] + [f"{c} stopped\n" for c in stopped]
        self.containers_file.write_text("".join(lines))

    def accepted_logins(self) -> int:
        """Connections sshd has authenticated so far (its log survives restarts)."""
        return self.log_path.read_text(errors="replace").count("Accepted publickey for ") if self.log_path.exists() else 0

    def start(self) -> None:
        try:
            os.makedirs("/run/sshd", exist_ok=True)  # privilege separation directory; a fresh container lacks it
        except PermissionError:
            pass
        listening_before = self._listening_lines()  # the log is kept across restarts
        log = self.log_path.open("ab")
        argv = [SSHD, "-D", "-e", "-f", str(self.config_path)]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns, *argv]  # exec's sshd in place: proc.pid is still sshd's
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited {self.proc.returncode}:\n{self.log_path.read_text(errors='replace')[-3000:]}")
            if not self.reachable_from_here:
                if self._listening_lines() > listening_before:
                    return
            else:
                try:
                    with socket.create_connection((self.hostname, self.port), timeout=1) as s:
                        if s.recv(64).startswith(b"SSH-"):
                            return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sshd not answering on port {self.port} after {READY_TIMEOUT} s")
            time.sleep(0.02)

    def _listening_lines(self) -> int:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text.count(f"Server listening on {self.hostname} port {self.port}.")

    def stop(self) -> None:
        """Stop the listener and every connection it spawned, as a host reboot or sshd restart would."""
        if self.proc is None:
            return
        # The per-connection processes first, so clients see their connections drop mid-command as after a
        # crash or reboot; then what ran under them, youngest first so a living parent reaps each one.
        tree = _process_tree(self.proc.pid)
        for generation in tree[:1] + tree[:0:-1]:
            for pid in generation:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 2
            while any(_alive(pid) for pid in generation) and time.monotonic() < deadline:
                time.sleep(0.01)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@contextmanager
def running_sshd() -> Iterator[SSHServer]:
    require_sshd()
    with tempfile.TemporaryDirectory(prefix="relaunch-sshd-") as tmp:
        server = SSHServer(Path(tmp))
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="module")
def sshd() -> Iterator[SSHServer]:
    """One sshd per test module."""
    with running_sshd() as server:
        yield server
