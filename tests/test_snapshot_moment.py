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
