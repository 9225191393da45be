"""Errors that carry what a person needs to act: host, command, exit code, output tail, advice."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    """What a command returned; an error that a command failed carries it whole."""

    exit_code: int
    stdout: str
    stderr: str = ""
    elapsed_seconds: float = 0.0

    @property
    def tail(self) -> str:
        text = (self.stdout + ("\n" + self.stderr if self.stderr else "")).strip()
        return "\n".join(text.splitlines()[-20:])


class RelaunchError(Exception):
    """Base of every error relaunch raises on purpose."""


class ConfigError(RelaunchError):
    """The target description is wrong; nothing was touched."""


class CommandFailed(RelaunchError):
    """A command ran on the host and exited non-zero. Never retried: the host said no.

    Carries the command's whole result (as invoke's UnexpectedExit carries its Result): `result.stdout`,
    `result.stderr`, `result.exit_code`, and the tail and advice a person reads."""

    def __init__(self, host: str, command: str, result: Result, advice: str = "") -> None:
        self.host, self.command, self.result, self.advice = host, command, result, advice
        super().__init__(self._message())

    @property
    def exit_code(self) -> int:
        return self.result.exit_code

    @property
    def output_tail(self) -> str:
        return self.result.tail

    def _message(self) -> str:
        tail = "\n".join("    " + line for line in self.output_tail.rstrip().splitlines()[-15:]) or "    (no output)"
        text = f"on {self.host}: `{self.command}` exited {self.exit_code}\n  output tail:\n{tail}"
        return f"{text}\n  what to do: {self.advice}" if self.advice else text


class CommandTooLong(RelaunchError):
    """A command larger than one argv string may be; never sent."""


class PreflightFailed(RelaunchError):
    """The target cannot be recovered as configured; found before anything changed."""

    def __init__(self, host: str, problems: list[str]) -> None:
        self.host, self.problems = host, problems
        super().__init__(
            f"preflight on {host} found {len(problems)} problem(s), nothing was changed:\n" + "\n".join(f"  - {p}" for p in problems)
        )


class TransportError(RelaunchError):
    """The host could not be reached or the connection broke: transient, worth a retry."""

    def __init__(self, host: str, command: str, reason: str, advice: str = "") -> None:
        self.host, self.command, self.reason, self.advice = host, command, reason, advice
        msg = f"on {host}: cannot run `{command}`: {reason}"
        super().__init__(f"{msg}\n  what to do: {advice}" if advice else msg)

    @classmethod
    def timed_out(cls, host: str, command: str, timeout: float) -> TransportError:
        """A command that ran past its timeout (stopped on the host): worth a retry, or a longer timeout."""
        return cls(
            host,
            command,
            f"timed out after {timeout:g} s (stopped on the host)",
            "raise the step's timeout if it is just slow, or check the host's load",
        )


class HostUnreachable(TransportError):
    """The connection to the host could not be opened: refused, no answer, a name that does not resolve, a jump host's
    tunnel. `first_contact`: this process had never reached the host, so nothing ran there; that is an answer (a
    wrong port, a host that is down), said at once and not retried. A host reached before (sshd restarting, a link
    back soon) is a fault of the wire, retried as any other."""

    def __init__(self, host: str, command: str, reason: str, advice: str = "", first_contact: bool = False) -> None:
        self.first_contact = first_contact
        super().__init__(host, command, reason, advice)


class HostKeyError(RelaunchError):
    """The host key is unknown or changed: never retried, a person must decide."""


class AuthenticationFailed(RelaunchError):
    """The host refused our credentials: never retried."""


class HostBusy(RelaunchError):
    """Another recovery holds this target's lock."""


class StateFolderTaken(RelaunchError):
    """The target's state folder holds another target's records: reading or acting on them would judge, stop or
    relaunch that target's trainer. Nothing was done."""

    def __init__(self, host: str, state: str, owner: str, identity: str) -> None:
        self.host, self.state, self.owner = host, state, owner
        super().__init__(
            f"on {host}: the state folder {state} belongs to another target ({owner}), not to this one ({identity}); nothing was done\n"
            "  what to do: give this target its own state_dir; if it is the same target renamed (name, repo_dir or tmux_session "
            f"changed), check that no trainer of the old one runs and remove {state}/target"
        )


class CheckpointUnusable(RelaunchError):
    """checkpoint_dir holds something relaunch must not guess about: names but no usable checkpoint, a tracker
    naming what is not there, or a loader that would take a checkpoint relaunch ruled out. Nothing was launched:
    a run from scratch would write a new "newest" checkpoint over the work it could not read."""

    def __init__(self, host: str, command: str, folder: str, problem: str, skipped: list[str], advice: str) -> None:
        self.host, self.command, self.folder = host, command, folder
        self.problem, self.skipped, self.advice = problem, skipped, advice
        listed = "\n".join(f"    - {s}" for s in skipped[:20]) + (f"\n    ... and {len(skipped) - 20} more" if len(skipped) > 20 else "")
        text = f"on {host}: `{command}` (exit 0): checkpoint_dir {folder}: {problem}; nothing was launched"
        super().__init__(f"{text}\n  skipped:\n{listed}\n  what to do: {advice}" if skipped else f"{text}\n  what to do: {advice}")


def is_transient(exc: BaseException) -> bool:
    """Only faults of the wire are retried; a command that failed on the host is an answer, and so is a host never
    reached in this process that cannot be connected to (HostUnreachable.first_contact)."""
    return isinstance(exc, TransportError) and not (isinstance(exc, HostUnreachable) and exc.first_contact)
