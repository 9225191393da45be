"""The host command of one health poll (relaunch/host/snapshot.sh); pure, no Prefect."""

from __future__ import annotations

from relaunch.commands import Command, script
from relaunch.config import Target
from relaunch.host import host_script
from relaunch.logtext import FAILURE_WORDS
from relaunch.runfiles import TAIL_BYTES, TAIL_LINES, state_identity


def plan_snapshot(
    target: Target,
    wait_seconds: float,
    nonce: str,
    tail_lines: int = TAIL_LINES,
    wake_on_log_write: bool = False,
    seen_step: tuple[float, int] | None = None,
    want_stacks: bool = False,
    wake_floor_seconds: float = 0.2,
) -> Command:
    """One poll; the wait is sent in milliseconds so a fractional poll interval is honoured.

    With `wake_on_log_write` the wait also ends when the trainer's log is written, not before `wake_floor_seconds`
    (a log written many times a second makes at most one poll per floor). `seen_step` (host time, step):
    what the previous poll read in the log, journaled by this one (RUN/journal). `want_stacks`: py-spy dumps of the
    tree's Python processes come back too (a quiet log over a busy tree: computing, or waiting?)."""
    args = (target.state_path, target.tmux_session, str(int(wait_seconds * 1000)), str(tail_lines), "1", nonce)
    args += (target.venv_dir, target.inductor_cache_dir, str(TAIL_BYTES), FAILURE_WORDS, target.log_dir, target.checkpoint_dir or "")
    args += (str(max(1, int(wake_floor_seconds * 1000))) if wake_on_log_write else "0", state_identity(target))
    args += (f"{seen_step[0]:.6f} {seen_step[1]}" if seen_step else "", "1" if want_stacks else "0")
    args += (target.repo_dir, target.launch_command)
    return script(host_script("snapshot"), *args, label="health poll", timeout_seconds=wait_seconds + 60)


def plan_journal_step(target: Target, run_id: str, seen_step: tuple[float, int]) -> Command:
    """The step a check's last poll read (host time, step), journaled in RUN/journal of `run_id` if it is still current:
    the next check learns the step interval from it, even where every check settles at its first poll."""
    return script(
        host_script("journal_step"),
        target.state_path,
        run_id,
        f"{seen_step[0]:.6f} {seen_step[1]}",
        label="journal step",
        timeout_seconds=30,
    )
