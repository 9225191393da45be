"""Remote commands as data. Builders here are pure; `Transport.run` is the one place that executes.

Values from the config never get spliced into script text: scripts read them as
positional arguments ("$1", "$2"), so each layer quotes exactly once.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from relaunch.config import Container


@dataclass(frozen=True)
class Command:
    """One command: argv run in cwd with env added, within timeout_seconds."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    timeout_seconds: float | None = None
    label: str = ""

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


@dataclass(frozen=True)
class Result:
    exit_code: int
    stdout: str
    stderr: str = ""
    elapsed_seconds: float = 0.0

    @property
    def tail(self) -> str:
        text = (self.stdout + ("\n" + self.stderr if self.stderr else "")).strip()
        return "\n".join(text.splitlines()[-20:])


def script(text: str, *args: str, label: str, timeout_seconds: float | None = None, env: dict[str, str] | None = None, cwd: str | None = None) -> Command:
    """A bash script whose values arrive as "$1".. rather than spliced into the text."""
    return Command(
        argv=("bash", "--noprofile", "--norc", "-c", text, label or "relaunch", *args),
        env=tuple(sorted((env or {}).items())),
        cwd=cwd,
        timeout_seconds=timeout_seconds,
        label=label,
    )


def host_argv(command: Command, container: Container | None) -> list[str]:
    """argv on the host: bash without start-up files, inside the container when there is one."""
    inner = ["bash", "--noprofile", "--norc", "-c", command.shell()]
    if container is None:
        return inner
    if container.kind == "pct":
        return ["pct", "exec", container.id, "--", *inner]
    return ["docker", "exec", "-i", container.id, *inner]


@dataclass(frozen=True)
class Plan:
    """An ordered list of commands a step would run: what `--dry-run` prints."""

    step: str
    commands: list[Command] = field(default_factory=list)
