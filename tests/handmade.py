"""Runs started by hand, and the processes around them, as tests/test_never_harm.py needs them.

Every process here is named by PID *and* start time (/proc/PID/stat field 22): a PID reused by another
process after ours died reads as dead, never as "still alive". Nothing here acts on processes by name: a
test's processes are found by the folder they run in (each test's own tmp repo) and killed by (PID, start).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from relaunch.testing import faults


@dataclass(frozen=True)
class Proc:
    """One process as seen once: its PID, its start time in clock ticks since boot, its argv."""

    pid: int
    start: int
    argv: tuple[str, ...] = ()

    def alive(self) -> bool:
        """Still the same process (same PID and start time) and not a zombie."""
        return start_time(self.pid) == self.start

    def __str__(self) -> str:
        return f"{self.pid} ({' '.join(self.argv)[:60] or '?'})"


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after it start at the last ')'.
    return text[text.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat; None for no such process or a zombie (a zombie has finished its work)."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return None
    return int(fields[19])


def parent_of(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def argv_of(pid: int) -> tuple[str, ...]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ()
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def cwd_of(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if b"=" in entry)
    return {key: value for key, _, value in pairs}


def proc(pid: int) -> Proc | None:
    start = start_time(pid)
    return None if start is None else Proc(pid, start, argv_of(pid))


def all_procs() -> list[Proc]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (p := proc(int(entry))) is not None:
            out.append(p)
    return out


def tree(root: int) -> list[Proc]:
    """The process and all its descendants, as they are now."""
    children: dict[int, list[int]] = {}
    for p in all_procs():
        parent = parent_of(p.pid)
        if parent is not None:
            children.setdefault(parent, []).append(p.pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if (p := proc(pid)) is not None:
            out.append(p)
            todo += children.get(pid, [])
    return out


def trainers(repo: str | Path, script: str) -> list[Proc]:
    """The live trainers of a target: processes running `script` (its argv names it) in the target's repo.

    Each test has its own tmp repo, so this is the target's own trainers and nothing else; a `sh -c "bash
    stepper.sh | tee ..."` wrapper names the script only inside its -c text and is not counted.
    """
    repo = Path(repo).resolve()
    found = {}
    for p in all_procs():
        if "-c" in p.argv or not any(Path(a).name == script for a in p.argv[1:2]):
            continue
        if cwd_of(p.pid) == repo:
            found[p.pid] = p
    # A bash trainer forks for each `sleep` and `$(...)`: until the child execs it shows the trainer's argv.
    # Such a fork is part of its parent, not a second trainer.
    return sorted((p for p in found.values() if parent_of(p.pid) not in found), key=lambda p: p.pid)


def dead(procs: Iterable[Proc]) -> list[Proc]:
    return [p for p in procs if not p.alive()]


def wait_for(condition: Callable[[], object], what: str, timeout_seconds: float = 20.0) -> object:
    """relaunch.testing.faults.wait_for with the description first, as this module's callers read best."""
    return faults.wait_for(condition, timeout_seconds, what, interval=0.05)


STEP = re.compile(r"\bstep=(\d+)")


def last_step(log: str | Path, pattern: re.Pattern[str] | None = None) -> int | None:
    """The highest step a log shows so far (None: no step line yet, or no log); `pattern`'s group 1 is the step."""
    pattern = pattern or STEP
    try:
        text = Path(log).read_text(errors="replace")
    except FileNotFoundError:
        return None
    steps = [int(m.group(1)) for m in pattern.finditer(text)]
    return max(steps) if steps else None


def tmux(*args: str, check: bool = True) -> str:
    out = subprocess.run(["tmux", *args], capture_output=True, text=True)
    # The shared tmux server was exiting (another test ended its last session) as this command reached it: asked
    # again, a new server starts. Seen once in a fresh-clone `make test` (test_adopt, 2026-12-02).
    if out.returncode != 0 and "server exited unexpectedly" in out.stderr:
        out = subprocess.run(["tmux", *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise AssertionError(f"tmux {' '.join(args)} exited {out.returncode}: {out.stderr.strip()}")
    return out.stdout.strip()


def start_by_hand(session: str, command: str, cwd: str | Path, env: dict[str, str] | None = None) -> int:
    """What a person types: `tmux new-session -d -s SESSION "COMMAND"`, in their repo. Returns the pane's PID."""
    extra = [a for key, value in (env or {}).items() for a in ("-e", f"{key}={value}")]
    return int(tmux("new-session", "-d", "-P", "-F", "#{pane_pid}", "-s", session, "-c", str(cwd), *extra, command))


def open_window(session: str, command: str) -> int:
    """A window the user opens in an existing session (`tmux new-window`). Returns its pane's PID."""
    return int(tmux("new-window", "-d", "-P", "-F", "#{pane_pid}", "-t", f"={session}:", command))


def kill_session(session: str) -> None:
    """`tmux kill-session`, as people stop a tmux run; exact name only."""
    tmux("kill-session", "-t", f"={session}", check=False)


def lose_pane(state_dir: str | Path, session: str) -> None:
    """The run's pane gone without a hangup (its process SIGKILLed: the OOM killer, a crash), so its session ends while
    relaunch's setsid trainer lives on. A `tmux kill-session` hangs the pane up instead, and that ends the trainer."""
    state = Path(state_dir)
    run = state / "runs" / (state / "current").read_text().strip()
    os.kill(int((run / "pane").read_text().split()[0]), signal.SIGKILL)
    wait_for(lambda: not _has_session(session), "the session to end")


def _has_session(session: str) -> bool:
    return subprocess.run(["tmux", "has-session", "-t", f"={session}"], capture_output=True).returncode == 0


def kill(procs: Iterable[Proc], sig: int = signal.SIGKILL) -> None:
    """Signal each process by PID, only while it is still the recorded one (its start time unchanged)."""
    for p in procs:
        if p.alive():
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass


def started_under(*folders: str | Path) -> list[Proc]:
    """Every process working in one of these folders or marked (RELAUNCH_RUN/RELAUNCH_TARGET) with a path under one."""
    roots = [str(Path(f).resolve()) for f in folders]
    mine = os.getpid()

    def under(path: str | None) -> bool:
        return bool(path) and any(path == r or path.startswith(r + "/") for r in roots)

    out = []
    for p in all_procs():
        if p.pid == mine:
            continue
        cwd = cwd_of(p.pid)
        env = environ_of(p.pid)
        if under(str(cwd) if cwd else None) or under(env.get("RELAUNCH_RUN")) or under(env.get("RELAUNCH_TARGET")):
            out.append(p)
    return out


def reap(sessions: Iterable[str], folders: Iterable[str | Path]) -> None:
    """A test's end: its tmux sessions (exact names), then every process it left in its folders, by (PID, start)."""
    for session in sessions:
        kill_session(session)
    folders = list(folders)
    for _ in range(3):
        left = started_under(*folders)
        if not left:
            return
        kill(left)
        wait_for(lambda: all(not p.alive() for p in left), "the test's processes to die", 10)
    left = started_under(*folders)
    assert not left, f"processes the test started are still alive: {[str(p) for p in left]}"


def write_kernel_line(text: str) -> str | None:
    """Write a line into the kernel log (root, /dev/kmsg) and see dmesg show it; the reason it could not, else."""
    try:
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(text + "\n")
    except OSError as exc:
        return f"/dev/kmsg is not writable here: {exc}"
    shown = subprocess.run(["dmesg"], capture_output=True, text=True)
    body = text.split(">", 1)[-1]
    if shown.returncode != 0 or body not in shown.stdout:
        return f"dmesg does not show the line written to /dev/kmsg (exit {shown.returncode}: {shown.stderr.strip()[:200]})"
    return None
