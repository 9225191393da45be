"""A launch outlasts tmux's own exit: the server went away under `new-session` (its last session had just ended
elsewhere), and the launch asks again instead of failing the recovery."""

from __future__ import annotations

import os
import shutil

import pytest

from relaunch.tasks.launch import launch
from relaunch.tasks.stop import stop
from relaunch.testing.targets import shell_target, tmux_alive

# What tmux prints when its server exits while a client talks to it (tmux 3.3, client.c), once; then the real tmux.
FLAKY_TMUX = """#!/bin/sh
if [ "$1" = new-session ] && [ ! -e "{flag}" ]; then
  : > "{flag}"
  echo "server exited unexpectedly" >&2
  exit 1
fi
exec {tmux} "$@"
"""


def test_a_new_session_the_exiting_tmux_server_refused_is_asked_for_again_and_the_trainer_runs(tmp_path, monkeypatch):
    real = shutil.which("tmux")
    if real is None:
        pytest.skip("tmux is not installed")
    bin_dir, flag = tmp_path / "bin", tmp_path / "refused-once"
    bin_dir.mkdir()
    (bin_dir / "tmux").write_text(FLAKY_TMUX.format(flag=flag, tmux=real))
    (bin_dir / "tmux").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    target = shell_target(tmp_path / "t")
    try:
        detail, _ = launch.fn(target, 1)
        assert flag.exists(), "the first new-session was refused"
        assert detail.pid and tmux_alive(target.tmux_session)
    finally:
        stop.fn(target)
