"""Never two trainers of one target, whatever the user did: the whole process table is looked at, not only tmux.

A trainer started by hand outside tmux, one left by a target renamed between nights, and one whose state folder was
removed carry no record relaunch can read; each is found (by the launch command's program running in repo_dir, or by
this target's marker), reported as unmanaged, never stopped, and no launch starts beside it. Real processes, real tmux.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from relaunch.deciding.playbook import remedy
from relaunch.errors import CommandFailed
from relaunch.tasks.health import check_health
from relaunch.tasks.launch import launch
from relaunch.testing.faults import making, wait_for
from relaunch.vocabulary import Action, Verdict


@pytest.fixture
def made(tmp_path):
    with making(tmp_path) as make:
        yield make


@pytest.fixture
def by_hand():
    """Trainers a person started outside tmux; killed at the end by PID (their process groups)."""
    started: list[subprocess.Popen] = []

    def start(repo: str, log: Path, script: str = "stepper.sh", cwd: str | None = None) -> subprocess.Popen:
        # `nohup bash stepper.sh > log 2>&1 &` from the repo, in a session of its own: no tmux, no marker.
        out = log.open("ab")
        proc = subprocess.Popen(["nohup", "bash", script], cwd=cwd or repo, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        started.append(proc)
        wait_for(lambda: log.exists() and b"step=" in log.read_bytes(), 20, "the hand-started trainer to step")
        return proc

    yield start
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def refused_launch(target) -> CommandFailed:
    with pytest.raises(CommandFailed) as refused:
        launch.fn(target, 1)
    return refused.value


def test_a_trainer_started_by_hand_outside_tmux_is_unmanaged_and_no_second_one_is_launched(made, tmp_path, by_hand):
    t = made()
    proc = by_hand(t.repo_dir, tmp_path / "nohup.out")
    health = check_health.fn(t)
    assert health.diagnosis.verdict is Verdict.UNMANAGED, (health.diagnosis.summary, health.diagnosis.evidence)
    assert remedy(health.diagnosis).action is Action.ESCALATE
    assert any(str(proc.pid) in line for line in health.diagnosis.evidence), health.diagnosis.evidence
    refusal = refused_launch(t)
    assert refusal.exit_code == 21, refusal
    assert "stepper.sh" in str(refusal)
    assert alive(proc.pid)
    assert not (Path(t.state_path) / "current").exists() or not list(Path(t.state_path).glob("runs/*/pid")), "a second trainer started"


@pytest.mark.parametrize("shape", ["absolute path from another folder", "the wrapper's program without the wrapper"])
def test_a_trainer_started_by_hand_in_any_folder_or_without_its_wrapper_script_is_found_and_none_launched_beside(
    made, tmp_path, by_hand, shape
):
    """`cd / && nohup bash /root/repo/stepper.sh &` (its folder is not the repo), and `nohup bash stepper.sh &` where the
    target launches `bash start.sh`, a wrapper that runs it (a person restarting the run skips the wrapper): either is
    the target's trainer, found by its program, reported unmanaged, and no second trainer starts beside it."""
    if shape == "absolute path from another folder":
        t = made()
        proc = by_hand(t.repo_dir, tmp_path / "nohup.out", script=str(Path(t.repo_dir) / "stepper.sh"), cwd="/")
    else:
        t = made(launch_command="bash start.sh")
        (Path(t.repo_dir) / "start.sh").write_text('#!/bin/bash\n# the run\'s wrapper\nset -e\nexec bash stepper.sh "$@"\n')
        proc = by_hand(t.repo_dir, tmp_path / "nohup.out")
    health = check_health.fn(t)
    assert health.diagnosis.verdict is Verdict.UNMANAGED, (health.diagnosis.summary, health.diagnosis.evidence)
    assert any(str(proc.pid) in line for line in health.diagnosis.evidence), health.diagnosis.evidence
    refusal = refused_launch(t)
    assert refusal.exit_code == 21 and f"PID {proc.pid}" in str(refusal), refusal
    assert alive(proc.pid)


def test_a_target_renamed_between_nights_finds_the_trainer_of_its_old_name(made, tmp_path):
    old = made()
    launch.fn(old, 1)
    wait_for(lambda: check_health.fn(old).diagnosis.verdict is Verdict.HEALTHY, 30, "the old name's run to be healthy")
    pid = int(next(Path(old.state_path).glob("runs/*/pid")).read_text().split()[0])
    # The same run, renamed: a new name (so a new state folder) and a new tmux session.
    renamed = old.model_copy(
        update={"name": "t-renamed", "tmux_session": f"relaunch-test-renamed-{uuid.uuid4().hex[:8]}", "state_dir": str(tmp_path / "state2")}
    )
    health = check_health.fn(renamed)
    assert health.diagnosis.verdict is Verdict.UNMANAGED, (health.diagnosis.summary, health.diagnosis.evidence)
    assert refused_launch(renamed).exit_code == 21
    assert alive(pid)


def test_a_trainer_whose_state_folder_was_removed_is_found_by_its_marker_and_never_stopped(made):
    t = made()
    launch.fn(t, 1)
    wait_for(lambda: check_health.fn(t).diagnosis.verdict is Verdict.HEALTHY, 30, "a healthy run")
    pid = int(next(Path(t.state_path).glob("runs/*/pid")).read_text().split()[0])
    # The state folder gone (a cleanup), relaunch's pane closed: nothing on record, the trainer runs on.
    shutil.rmtree(t.state_path)
    subprocess.run(["tmux", "kill-session", "-t", f"={t.tmux_session}"], check=False)
    health = check_health.fn(t)
    assert health.diagnosis.verdict is Verdict.UNMANAGED, (health.diagnosis.summary, health.diagnosis.evidence)
    assert any("marker" in line for line in health.diagnosis.evidence)
    assert refused_launch(t).exit_code in (18, 21)
    assert alive(pid)
