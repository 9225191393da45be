"""Remote commands as data. Builders here are pure; `Transport.run` is the one place that executes.

Values from the config never get spliced into script text: scripts read them as
positional arguments ("$1", "$2"), so each layer quotes exactly once.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass

from relaunch.config import Container
from relaunch.errors import CommandTooLong, Result
from relaunch.host import host_script


@dataclass(frozen=True)
class Command:
    """One command: argv run in cwd with env added, within timeout_seconds."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    timeout_seconds: float | None = None
    label: str = ""
    # Folder where the host records this command while it runs (PID, start time, process group), so
    # the next recovery can stop what a killed orchestrator left running. None: not recorded.
    track_in: str | None = None

    def shell(self) -> str:
        """The command as one string for `bash -c` (the innermost layer)."""
        parts = []
        if self.cwd:
            parts.append(f"cd -- {shlex.quote(self.cwd)} &&")
        parts.append("exec")
        if self.env:
            parts.append("env " + " ".join(shlex.quote(f"{k}={v}") for k, v in self.env))
        parts.append(shlex.join(self.argv))
        return " ".join(parts)

    @property
    def display(self) -> str:
        """Short human form for errors and logs."""
        return self.label or shlex.join(self.argv)[:300]


def script(
    text: str, *args: str, label: str, timeout_seconds: float | None = None, env: dict[str, str] | None = None, cwd: str | None = None
) -> Command:
    """A bash script whose values arrive as "$1".. rather than spliced into the text."""
    return Command(
        argv=("bash", "--noprofile", "--norc", "-c", text, label or "relaunch", *args),
        env=tuple(sorted((env or {}).items())),
        cwd=cwd,
        timeout_seconds=timeout_seconds,
        label=label,
    )


# Linux caps one argv string at 128 KiB (MAX_ARG_STRLEN); over SSH, far past it sshd drops the connection.
MAX_COMMAND_BYTES = 128 * 1024 - 1
# The host's own `timeout` gets this long to stop a command before the client gives up on it.
HOST_TIMEOUT_GRACE_SECONDS = 15
TIMEOUT_EXIT = 124


def host_argv(command: Command, container: Container | None, timeout_seconds: float | None = None) -> list[str]:
    """argv on the host: bash without start-up files, under the host's `timeout`, in the container if any.

    The host enforces the timeout: closing an SSH channel does not stop a command without a terminal.
    """
    shell = command.shell()
    if len(shell.encode()) > MAX_COMMAND_BYTES:
        raise CommandTooLong(
            f"`{command.display}` is {len(shell.encode())} bytes; the limit is {MAX_COMMAND_BYTES}: send large data as a file"
        )
    inner = ["bash", "--noprofile", "--norc", "-c", shell]
    if command.track_in:
        inner = ["bash", "--noprofile", "--norc", "-c", TRACK, "relaunch-track", command.track_in, _slug(command.label), *inner]
    if timeout_seconds:
        inner = ["timeout", "-k", "10", str(math.ceil(timeout_seconds)), *inner]
    if container is None:
        return inner
    if container.kind == "pct":
        return ["pct", "exec", container.id, "--", *inner]
    return ["docker", "exec", "-i", container.id, *inner]


# Inside `timeout` (which leads its own process group): record PID, start time and group while the
# command runs. A SIGKILLed orchestrator cannot stop the command; the record lets the next one.
TRACK = host_script("track")


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label)[:60] or "command"


def timed_out_on_host(result: Result, timeout_seconds: float) -> bool:
    """`timeout` exits 124 when it stopped the command; a command's own 124 comes back sooner."""
    return result.exit_code == TIMEOUT_EXIT and result.elapsed_seconds >= timeout_seconds - 1


# A container command that never reached its container says so in words a person can act on.
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
