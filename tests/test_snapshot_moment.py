"""A health check's reading is one moment: the trainer and its supervisor are read alive or dead before the exit
record, so a trainer that dies while the check is still reading is never a death without an exit code.

Seen in `make test` on a loaded host (xdist, 2 cores): a trainer exiting 7 at its second step was read as
`crashed (silent_exit)` and the check offered a relaunch from the newest checkpoint instead of the full recovery
an exit code 7 calls for. The snapshot had read the exit record (none yet), then the supervisor recorded the exit
and ended, then the snapshot read both dead.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from relaunch.judging.diagnosis import diagnose
from relaunch.tasks.health import collect_snapshot
from relaunch.tasks.launch import launch
from relaunch.testing.faults import wait_for
from relaunch.testing.targets import current_log, runs, shell_target, stop_all
from relaunch.vocabulary import Cause, Verdict

# `tmux has-session` is the snapshot's last question before it prints what it read: here the trainer dies in that
# moment, and the shim returns only once the supervisor has recorded the exit and ended (the slow host's order).
DYING_TMUX = """#!/bin/bash
if [ "$1" = has-session ] && [ ! -e "{flag}" ]; then
  : > "{flag}"
  read -r trainer _ < "{run}/pid"; read -r supervisor _ < "{run}/supervisor_pid"
  kill -KILL "$trainer"
  for _ in $(seq 600); do [ -e "{run}/exit_code" ] && ! kill -0 "$supervisor" 2> /dev/null && break; sleep 0.05; done
fi
exec {tmux} "$@"
"""


def test_a_trainer_that_dies_while_the_check_reads_is_never_read_as_a_death_without_an_exit_code(tmp_path, monkeypatch):
    real = shutil.which("tmux")
    if real is None:
        pytest.skip("tmux is not installed")
    target = shell_target(tmp_path / "t")
    launch.fn(target, 1)
    try:
        wait_for(lambda: "step=2 " in current_log(target).read_text(), 30, "two step lines")
        (run_id,) = runs(target)
        run = tmp_path / "t" / "state" / "runs" / run_id
        bin_dir, flag = tmp_path / "bin", tmp_path / "killed"
        bin_dir.mkdir()
        (bin_dir / "tmux").write_text(DYING_TMUX.format(flag=flag, run=run, tmux=real))
        (bin_dir / "tmux").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        snap = collect_snapshot(target, wait_seconds=0)
        assert flag.exists() and (run / "exit_code").read_text().strip() == "137", "the trainer died inside the reading"
        assert not (not snap.pid_alive and snap.exit_code is None and not snap.supervisor_alive), snap
        d = diagnose(snap, target.thresholds)
        assert d.cause is not Cause.SILENT_EXIT, d
        after = diagnose(collect_snapshot(target, wait_seconds=0), target.thresholds)
        assert (after.verdict, after.cause) == (Verdict.CRASHED, Cause.KILLED) and "137" in " ".join(after.evidence), after
    finally:
        stop_all(target)


def test_a_dead_pane_tmux_keeps_is_no_foreign_run_and_the_next_launch_closes_it(tmp_path):
    """A pane whose program has ended but that tmux still lists (`remain-on-exit on` in a person's tmux.conf; for a
    moment on a loaded host, until tmux reaps it) holds nothing. Read as a foreign program, it made the dead run
    `unmanaged (not_a_trainer)`, never recovered, and the launch refused beside the session (exit 11)."""
    target = shell_target(tmp_path / "t", env={"EXIT_AT": "15", "EXIT_CODE": "3"})
    launch.fn(target, 1)
    try:
        subprocess.run(["tmux", "set-option", "-w", "-t", f"={target.tmux_session}:", "remain-on-exit", "on"], check=True)
        (run_id,) = runs(target)
        run = tmp_path / "t" / "state" / "runs" / run_id
        pane = int((run / "pane").read_text().split()[0])
        wait_for(lambda: (run / "exit_code").exists() and not os.path.exists(f"/proc/{pane}"), 60, "the trainer's exit and its pane's end")
        dead = subprocess.run(
            ["tmux", "list-panes", "-s", "-t", f"={target.tmux_session}", "-F", "#{pane_dead}"], capture_output=True, text=True
        )
        assert dead.stdout.split() == ["1"], "tmux did not keep the dead pane: the shape was not made"
        d = diagnose(collect_snapshot(target, wait_seconds=0), target.thresholds)
        assert d.verdict is Verdict.CRASHED and "3" in " ".join(d.evidence), d
        record, _ = launch.fn(target, 2)
        assert record.pid and os.path.exists(f"/proc/{record.pid}"), "the next launch did not start"
        assert list((tmp_path / "t" / "state").glob("dead_pane_*.txt")), "the dead pane's last screen was not kept"
    finally:
        stop_all(target)
