"""Each recovery step against the real thing on this machine: tmux, git, uv, processes, files."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from relaunch.config import Thresholds
from relaunch.errors import CommandFailed, PreflightFailed
from relaunch.host import host_script
from relaunch.tasks.health import collect_snapshot, poll_until_settled
from relaunch.tasks.launch import launch
from relaunch.tasks.preflight import preflight
from relaunch.tasks.rebuild_venv import rebuild_venv
from relaunch.tasks.restore_code import restore_code
from relaunch.tasks.stop import stop
from relaunch.tasks.warm_cache import warm_cache
from relaunch.testing.faults import making, wait_for
from relaunch.testing.targets import tmux_alive
from relaunch.vocabulary import Cause, Verdict

LONG_POLL = 120  # seconds a poll may wait for the trainer to die: far longer than any wait these tests expect


@pytest.fixture
def made(tmp_path):
    with making(tmp_path) as make:
        yield make


@pytest.fixture
def target(made):
    return made()


def run_record(target):
    state = Path(target.state_path)
    return state / "runs" / (state / "current").read_text().strip()


def test_launch_records_pid_and_the_log_gets_the_trainers_output(target):
    record, step = launch.fn(target, 1)
    assert record.pid and os.path.exists(f"/proc/{record.pid}")
    result = poll_until_settled(target)
    assert result.diagnosis.verdict is Verdict.HEALTHY
    assert "step=3" in Path(record.log_path).read_text()
    assert tmux_alive(target.tmux_session)


def test_a_start_up_poll_returns_at_the_first_step_line_not_at_the_end_of_its_interval(made):
    # Issue 33: from a launch to healthy without a fixed wait. The trainer's first step line comes 2 s after its start;
    # the poll interval is 60 s. A start-up poll wakes on the log's writes, so the verdict settles at the line.
    thresholds = Thresholds(startup_grace_seconds=120, poll_interval_seconds=60, settle_timeout_seconds=120, healthy_steps=1)
    t = made(env={"START_SECONDS": "2"}, thresholds=thresholds)
    launch.fn(t, 1)
    result = poll_until_settled(t)
    assert result.diagnosis.verdict is Verdict.HEALTHY, result.diagnosis
    assert result.seconds < 30, f"settled {result.seconds} s after the launch: a poll waited out its 60 s interval"


def test_exit_code_is_recorded_and_a_death_ends_the_poll_at_once(made):
    # The trainer dies by itself at step 15 (0.2 s a step: ~3 s after launch), while a poll that may wait 120 s runs.
    t = made(env={"EXIT_AT": "15", "EXIT_CODE": "3"})
    launch.fn(t, 1)
    exit_code = run_record(t) / "exit_code"
    started = time.time()
    snap = collect_snapshot(t, wait_seconds=LONG_POLL)
    returned = time.time()
    assert snap.exit_code == 3 and not snap.pid_alive
    died = exit_code.stat().st_mtime  # the supervisor writes it the moment the trainer exits
    assert started < died, "the trainer must die during the poll, not before it (launch took too long?)"
    assert returned - died < 10, (
        f"the poll returned {returned - died:.1f} s after the death; it must end at the death, not after its {LONG_POLL} s wait"
    )
    # A poll of a trainer that is already dead does not wait either.
    before = time.monotonic()
    assert collect_snapshot(t, wait_seconds=LONG_POLL).exit_code == 3
    assert time.monotonic() - before < 10, f"a poll of a dead trainer waited (up to {LONG_POLL} s)"
    d = poll_until_settled(t).diagnosis
    assert (d.verdict, d.cause) == (Verdict.CRASHED, Cause.ERROR)
    assert "exit code 3" in d.evidence
    # tail --pid notices within a second that the trainer is gone.
    wait_for(lambda: not tmux_alive(t.tmux_session), 10, "the pane to end with the trainer: nothing lingers")


def test_a_trainer_killed_with_its_session_is_a_silent_exit(target):
    launch.fn(target, 1)
    supervisor = int((run_record(target) / "supervisor_pid").read_text().split()[0])
    os.killpg(supervisor, signal.SIGKILL)
    subprocess.run(["tmux", "kill-session", "-t", f"={target.tmux_session}"], check=True)
    d = poll_until_settled(target).diagnosis
    assert (d.verdict, d.cause) == (Verdict.CRASHED, Cause.SILENT_EXIT)


def test_tmux_kill_session_ends_the_trainer_it_holds_and_is_recorded_as_a_deliberate_stop(target):
    # How people stop a tmux run: the trainer ends as a run started by hand in the pane would (SIGHUP), and no check
    # relaunches what a person ended.
    record, _ = launch.fn(target, 1)
    wait_for(lambda: "step=" in Path(record.log_path).read_text(), 10, "the trainer to step")
    subprocess.run(["tmux", "kill-session", "-t", f"={target.tmux_session}"], check=True)
    wait_for((run_record(target) / "exit_code").exists, 10, "the trainer to end with its session")
    assert (run_record(target) / "exit_code").read_text().strip() == "129"
    d = poll_until_settled(target).diagnosis
    assert d.verdict is Verdict.STOPPED, d
    assert "tmux session ended" in d.summary
    assert Path(record.log_path).exists(), "the log is kept"


def sighup_ignored(pid: int) -> bool:
    """Whether PID ignores SIGHUP (bit 0 of SigIgn in /proc/PID/status), as nohup makes its program do."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return any(line.startswith("SigIgn:") and int(line.split()[1], 16) & 1 for line in status.splitlines())


def test_a_trainer_that_ignores_the_hangup_lives_on_after_its_session_ends(target):
    # `nohup`: the hangup is ignored, as it would be by hand; the run is not ended for it, and a check judges it live.
    nohup = target.model_copy(update={"launch_command": "nohup bash stepper.sh"})
    record, _ = launch.fn(nohup, 1)
    # The shape is a trainer that ignores the hangup: nohup has set that up (SIGHUP in SigIgn) before the session ends.
    # A kill-session in the instant before, as a loaded make test made, hangs up a trainer that did not ignore it yet.
    wait_for(lambda: sighup_ignored(record.pid), 20, "nohup to ignore SIGHUP in the trainer")
    subprocess.run(["tmux", "kill-session", "-t", f"={target.tmux_session}"], check=True)
    log = Path(record.log_path)
    size = log.stat().st_size
    wait_for(lambda: log.stat().st_size > size, 10, "the trainer to write more to its log with its session gone")
    snap = collect_snapshot(target)
    assert snap.pid_alive and not snap.session_alive


def test_launch_refuses_while_the_recorded_trainer_is_alive(target):
    launch.fn(target, 1)
    with pytest.raises(CommandFailed, match="refusing to start a second one"):
        launch.fn(target, 2)


def test_stop_ends_the_recorded_trainer_and_leaves_lookalike_processes_alone(target):
    record, _ = launch.fn(target, 1)
    decoy = subprocess.Popen(["bash", "stepper.sh"], cwd=target.repo_dir, stdout=subprocess.DEVNULL)
    try:
        stop.fn(target)
        assert not os.path.exists(f"/proc/{record.pid}")
        assert not tmux_alive(target.tmux_session)
        assert decoy.poll() is None, "a process that only looks like the trainer was killed"
        assert (run_record(target) / "exit_code").read_text().strip() == "143"
    finally:
        decoy.kill()


def test_relaunch_resumes_from_the_newest_checkpoint(target):
    ckpt = Path(target.checkpoint_dir)
    for name in ("step_90", "step_600", "step_200"):
        (ckpt / name).mkdir(parents=True)
        (ckpt / name / "weights.bin").write_bytes(b"w")
    record, _ = launch.fn(target, 1)
    assert record.checkpoint == f"{ckpt}/step_600"
    assert record.command.endswith(f"{ckpt}/step_600")


def test_restore_saves_uncommitted_edits_as_a_patch_that_reapplies(target):
    model = Path(target.repo_dir) / "model.py"
    model.write_text("VALUE = 2  # hack\n")
    step = restore_code.fn(target)
    assert model.read_text() == "VALUE = 1\n"
    patch = step.detail.patch
    subprocess.run(["git", "-C", target.repo_dir, "apply", "--check", patch], check=True)
    subprocess.run(["git", "-C", target.repo_dir, "apply", patch], check=True)
    assert model.read_text() == "VALUE = 2  # hack\n"


def test_rebuild_moves_old_venvs_aside_keeps_two_and_reports_drift(target):
    subprocess.run(["uv", "venv", "-q", "--python", target.python, target.venv_dir], check=True)
    first = rebuild_venv.fn(target)
    assert first.detail.old_venv_drift == ["tinyjunk: in lock (0.1.0), not installed"], "what was wrong with the old venv"
    for _ in range(2):
        step = rebuild_venv.fn(target)
    venvs = sorted(p.name for p in Path(target.venv_dir).parent.glob("venv*"))
    assert venvs[0] == "venv" and len([v for v in venvs if ".old-" in v]) == 2
    assert step.detail.drift == []
    out = subprocess.run(
        [f"{target.venv_dir}/bin/python", "-c", "import tinyjunk; print(tinyjunk.__version__)"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "0.1.0"


def test_a_lock_that_cannot_be_installed_fails_and_puts_the_old_venv_back(made):
    t = made()
    subprocess.run(["uv", "venv", "-q", "--python", t.python, t.venv_dir], check=True)
    marker = Path(t.venv_dir) / "mine"
    marker.write_text("the user's venv")
    Path(t.lock_path).write_text("tinyjunk==9.9.9\n")
    with pytest.raises(CommandFailed) as err:
        rebuild_venv.fn(t)
    assert "uv pip sync" in str(err.value) and "exited" in str(err.value)
    assert marker.read_text() == "the user's venv"


def test_warm_up_runs_in_the_repo_with_the_trainers_cache_dir_and_env(made):
    t = made(warmup_command='echo "$TORCHINDUCTOR_CACHE_DIR $FOO $PWD" > "$TORCHINDUCTOR_CACHE_DIR/seen"', env={"FOO": "bar baz"})
    (Path(t.inductor_cache_dir) / "ab").mkdir(parents=True)
    (Path(t.inductor_cache_dir) / "ab" / "cabstale.so").write_text("old")
    step = warm_cache.fn(t)
    assert not (Path(t.inductor_cache_dir) / "ab").exists()
    assert not list(Path(t.inductor_cache_dir).parent.glob("*.relaunch-cleared-*")), "a cache-only aside copy is removed"
    assert (Path(t.inductor_cache_dir) / "seen").read_text().strip() == f"{t.inductor_cache_dir} bar baz {t.repo_dir}"
    assert step.detail.cache_bytes > 0


def test_preflight_lists_every_problem_before_anything_changes(made):
    t = made(known_good_ref="no-such-ref", lock_file="missing.lock", log_dir="/etc/hostname/logs")
    with pytest.raises(PreflightFailed) as err:
        preflight.fn(t)
    text = str(err.value)
    assert "known_good_ref 'no-such-ref'" in text and "missing.lock does not exist" in text and "log_dir /etc/hostname/logs" in text
    assert not Path(t.state_path).exists()


def test_relaunch_rollback_venv_puts_the_previous_venv_back_in_one_command(target, tmp_path):
    import yaml
    from typer.testing import CliRunner

    from relaunch.cli.app import app

    subprocess.run(["uv", "venv", "-q", "--python", target.python, target.venv_dir], check=True)
    (Path(target.venv_dir) / "mine").write_text("the user's venv")
    rebuild_venv.fn(target)
    assert not (Path(target.venv_dir) / "mine").exists()
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(target.model_dump(mode="json")))
    result = CliRunner().invoke(app, ["rollback-venv", str(path)])
    assert result.exit_code == 0, result.output
    assert (Path(target.venv_dir) / "mine").read_text() == "the user's venv"
    assert "rolled-back" in result.output


def test_the_pane_outlives_a_supervisor_that_records_its_pid_late_and_then_follows_it(tmp_path):
    # A loaded host: the supervisor records itself after 11 s (the launcher used to give up at 10 s, ending
    # the pane and the tmux session under a trainer that ran on).
    run = tmp_path / "run"
    run.mkdir()
    (run / "log_path").write_text(str(tmp_path / "train.log"))
    (run / "supervisor.sh").write_text('sleep 11; echo "$$ 0" > "$1/supervisor_pid"; exec sleep 60\n')
    (run / "launcher.sh").write_text(host_script("launcher"))
    session = f"relaunch-test-late-{uuid.uuid4().hex[:8]}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "bash", str(run / "launcher.sh"), str(run)], check=True)
    try:
        wait_for(lambda: (run / "supervisor_pid").exists(), 30, "the supervisor to record its PID")
        supervisor = int((run / "supervisor_pid").read_text().split()[0])
        assert tmux_alive(session), "the pane ended before the supervisor recorded itself"
        os.killpg(supervisor, signal.SIGKILL)
        wait_for(lambda: not tmux_alive(session), 10, "the pane to end with the supervisor it follows")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", f"={session}"], capture_output=True)
        if (run / "supervisor_pid").exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int((run / "supervisor_pid").read_text().split()[0]), signal.SIGKILL)


def test_a_trainer_killed_inside_a_wrapper_script_that_exits_0_is_crashed_killed_not_finished(made):
    # `bash start.sh`, start.sh running the trainer then one more line: the trainer's SIGKILL leaves the script's 0. bash's
    # job line in the log is the witness (tests/fixtures/logs/cpu/wrapped_sig*.log: its captured form).
    t = made(launch_command="bash start.sh")
    (Path(t.repo_dir) / "start.sh").write_text("#!/bin/bash\nbash stepper.sh\necho 'start.sh: training script ended'\n")
    record, _ = launch.fn(t, 1)
    log = Path(record.log_path)
    wait_for(lambda: "step=2 " in log.read_text(), 30, "two step lines")
    table = [
        line.split(None, 2)
        for line in subprocess.run(["ps", "-e", "-o", "pid=,ppid=,args="], capture_output=True, text=True).stdout.splitlines()
    ]
    tree, grew = {str(record.pid)}, True
    while grew:
        grew = bool({pid for pid, ppid, _ in table if ppid in tree} - tree)
        tree |= {pid for pid, ppid, _ in table if ppid in tree}
    (trainer,) = [int(pid) for pid, _, args in table if pid in tree and args == "bash stepper.sh"]
    os.kill(trainer, signal.SIGKILL)  # the wrapper's trainer, by its PID in the recorded tree
    # The script's 0, or (where a child of the killed trainer outlived the script a moment) no exit code: either way not
    # the trainer's own.
    ended = [run_record(t) / "exit_code", run_record(t) / "detached"]
    wait_for(lambda: any(p.exists() for p in ended), 30, "the supervisor to record the script's end")
    d = poll_until_settled(t).diagnosis
    assert (d.verdict, d.cause) == (Verdict.CRASHED, Cause.KILLED), (d.summary, d.evidence)
