"""How commands reach a host. One transport per host and process, reused by every step and poll."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from relaunch.config import Host
from relaunch.errors import CommandFailed, Result, TransportError
from relaunch.wire.commands import HOST_TIMEOUT_GRACE_SECONDS, Command, describe_container_failure, host_argv, timed_out_on_host


class Transport(Protocol):
    host: Host

    def execute(self, command: Command) -> Result:
        """Run the command; raise TransportError when it could not be run or timed out."""

    def close(self) -> None: ...


# Advice for a command that failed: one text, or one per exit code (the key None: any code not listed).
Advice = str | Mapping[int | None, str]


def advice_for(advice: Advice, exit_code: int) -> str:
    """What to do about the exit code that happened, and nothing about the others."""
    if isinstance(advice, str):
        return advice
    return advice.get(exit_code, advice.get(None, ""))


def run(transport: Transport, command: Command, *, check: bool = True, advice: Advice = "") -> Result:
    """The one entry point steps use; turns a non-zero exit into CommandFailed when check is set, with the advice for
    its exit code."""
    result = transport.execute(command)
    if check and result.exit_code != 0:
        advice = advice_for(advice, result.exit_code)
        # A command that never reached its container (stopped, missing, no pct) gets that said first.
        container = describe_container_failure(result) if transport.host.container else None
        raise CommandFailed(
            transport.host.label, command.display, result, f"{container}; {advice}" if container and advice else container or advice
        )
    return result


class LocalTransport:
    """Commands on this machine, through the same bash (and container) layers as a remote host."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def execute(self, command: Command) -> Result:
        timeout = command.timeout_seconds or self.host.command_timeout_seconds
        argv = host_argv(command, self.host.container, timeout)
        start = time.monotonic()
        try:
            proc = subprocess.run(
                argv, capture_output=True, timeout=timeout + HOST_TIMEOUT_GRACE_SECONDS, stdin=subprocess.DEVNULL, env=local_env()
            )
        except subprocess.TimeoutExpired as exc:
            raise TransportError.timed_out(self.host.label, command.display, timeout) from exc
        except OSError as exc:
            raise TransportError(
                self.host.label,
                command.display,
                f"cannot start {argv[0]}: {exc.strerror}",
                f"check that {argv[0]} is installed on this machine",
            ) from exc
        # Bytes, decoded once: text mode would turn \r\n into \n and the output would not be byte for byte.
        # A signal death reads as the shell reports it (128 + N), the same as over SSH and in exit-code files.
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        result = Result(code, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"), time.monotonic() - start)
        if timed_out_on_host(result, timeout):
            raise TransportError.timed_out(self.host.label, command.display, timeout)
        return result

    def close(self) -> None:
        pass


def local_env() -> dict[str, str]:
    """This process's environment, with relaunch's own `uv` findable: a plain shell's PATH may not hold it."""
    env = dict(os.environ)
    uv = uv_dir()
    paths = env.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    if uv and not shutil.which("uv", path=env.get("PATH")):
        env["PATH"] = os.pathsep.join([*paths, uv])
    return env


@functools.cache
def uv_dir() -> str | None:
    """Where the uv that came with relaunch lives: beside its interpreter, or the `uv` package's binary."""
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file():
        return str(beside.parent)
    try:
        from uv import find_uv_bin

        return str(Path(find_uv_bin()).parent)
    except (ImportError, FileNotFoundError):
        return None


_POOL: dict[str, Transport] = {}


def transport_for(host: Host) -> Transport:
    """The shared transport for a host: one connection per flow run (process), reused."""
    key = host.model_dump_json()
    if key not in _POOL:
        if host.kind == "local":
            _POOL[key] = LocalTransport(host)
        else:
            from relaunch.wire.ssh import SSHTransport

            _POOL[key] = SSHTransport(host)
    return _POOL[key]


def close_all() -> None:
    while _POOL:
        _POOL.popitem()[1].close()
