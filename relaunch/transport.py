"""How commands reach a host. One transport per host and process, reused by every step and poll."""

from __future__ import annotations

import subprocess
import time
from typing import Protocol

from relaunch.commands import Command, Result, host_argv
from relaunch.config import Host
from relaunch.errors import CommandFailed, TransportError


class Transport(Protocol):
    host: Host

    def execute(self, command: Command) -> Result:
        """Run the command; raise TransportError when it could not be run or timed out."""

    def close(self) -> None: ...


def run(transport: Transport, command: Command, *, check: bool = True, advice: str = "") -> Result:
    """The one entry point steps use; turns a non-zero exit into CommandFailed when check is set."""
    result = transport.execute(command)
    if check and result.exit_code != 0:
        raise CommandFailed(transport.host.label, command.display, result.exit_code, result.tail, advice)
    return result


class LocalTransport:
    """Commands on this machine, through the same bash (and container) layers as a remote host."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def execute(self, command: Command) -> Result:
        argv = host_argv(command, self.host.container)
        timeout = command.timeout_seconds or self.host.command_timeout_seconds
        start = time.monotonic()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise TransportError(self.host.label, command.display, f"timed out after {timeout:.0f} s", "raise the timeout or check the host load") from exc
        except FileNotFoundError as exc:
            raise TransportError(self.host.label, command.display, f"{argv[0]} not found", f"install {argv[0]} on this machine") from exc
        return Result(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)

    def close(self) -> None:
        pass


_POOL: dict[str, Transport] = {}


def transport_for(host: Host) -> Transport:
    """The shared transport for a host: one connection per flow run (process), reused."""
    key = host.model_dump_json()
    if key not in _POOL:
        if host.kind == "local":
            _POOL[key] = LocalTransport(host)
        else:
            from relaunch.ssh import SSHTransport

            _POOL[key] = SSHTransport(host)
    return _POOL[key]


def close_all() -> None:
    while _POOL:
        _POOL.popitem()[1].close()
