"""Runs a person started by hand in the target's tmux session are adopted, not harmed; what is no run is left alone.

Every run here is started as in the incident, by hand: `tmux new-session -d -s SESSION "bash stepper.sh 2>&1 |
tee LOG"` (or a bare `python -c` whose stdout is a file), with no record in the state folder. The checks are the
health poll's own functions (relaunch.tasks.health), called as plain functions; the processes are real, named by PID and
start time before and after.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from relaunch.errors import CommandFailed
from relaunch.runlayout import state_identity
from relaunch.tasks.adopt import adopt_run
from relaunch.tasks.health import check_health, collect_snapshot
from relaunch.tasks.launch import launch
from relaunch.testing.faults import RELAUNCH, making
from relaunch.testing.sshd import cannot_run_here
from relaunch.testing.targets import current, tmux_alive
from relaunch.vocabulary import Cause, Verdict
from tests.handmade import (
    Proc,
    kill_session,
    last_step,
    lose_pane,
    open_window,
    proc,
    reap,
    start_by_hand,
    tree,
    wait_for,
    write_kernel_line,
)

HOST_DIR = Path(__file__).resolve().parent.parent / "relaunch" / "host"
# A trainer in Python, printing the stepper's lines to its standard output (which the shell points at a file).
PY_STEPPER = (
    "import time\n"
    "for i in range(1, 100000):\n"
    "    print(f'step={i} loss=3.6441 acc=0.097 lr=3.96e-04 | dft=0.50b/s (20.0Ktok/s) | q_hs=[2]', flush=True)\n"
    "    time.sleep(0.2)\n"
)


@pytest.fixture
def made(tmp_path):
    with making(tmp_path) as make:
        yield make


@pytest.fixture
def by_hand(tmp_path):
    """Start commands in tmux as a person does; at the end their sessions and every process left under tmp_path go."""
    sessions: list[str] = []

    def start(session: str, command: str, cwd: str | Path) -> Proc:
        sessions.append(session)
        pane = proc(start_by_hand(session, command, cwd))
        assert pane is not None, f"`{command}` ended at once in tmux session {session}"
        return pane

    yield start
    reap(sessions, [tmp_path])


def run_folder(target) -> Path:
    return Path(target.state_path) / "runs" / current(target)


def stepping(log: Path, beyond: int = 0, timeout_seconds: float = 20) -> int:
    return wait_for(lambda: (last_step(log) or 0) > beyond and last_step(log), f"{log} to show a step after {beyond}", timeout_seconds)


def alive(procs: list[Proc]) -> list[Proc]:
    return [p for p in procs if p.alive()]


def test_check_adopts_a_run_started_by_hand_with_tee_says_healthy_and_leaves_its_processes_alone(made, by_hand, tmp_path):
    target = made()
    log = tmp_path / "workspace" / "train_stdout_clean.log"
    log.parent.mkdir()
    pane = by_hand(target.tmux_session, f"bash stepper.sh 2>&1 | tee {shlex.quote(str(log))}", target.repo_dir)
    stepping(log)
    before = tree(pane.pid)  # the shell, the stepper, tee (and the stepper's sleep of the moment)
    result = check_health.fn(target)
    assert result.diagnosis.verdict is Verdict.HEALTHY, result.diagnosis
    snap = result.snapshot
    assert snap.adopted and snap.pid == pane.pid and snap.pid_alive
    run = run_folder(target)
    assert run.name.endswith("-adopted")
    assert (run / "adopted").read_text().strip() == "tee"
    assert (run / "log_path").read_text().strip() == str(log)
    assert (run / "pid").read_text().split() == [str(pane.pid), str(pane.start)]
    assert (run / "pane").read_text().split() == [str(pane.pid), str(pane.start)]
    assert re.fullmatch(r"%\d+", (run / "pane_id").read_text().strip())
    assert (Path(target.state_path) / "target").read_text().strip() == state_identity(target)
    assert {p.pid for p in before if p.argv[:1] in (("bash",), ("tee",))} <= set(snap.tree_pids), "the run's tree is recorded"
    long_lived = [p for p in before if p.argv[:1] != ("sleep",)]
    assert alive(long_lived) == long_lived, "no process of the hand-started run was touched"
    at = last_step(log)
    stepping(log, beyond=at)
    # A later check judges the adopted run as relaunch's own: the same record, no second adoption.
    again = check_health.fn(target)
    assert again.diagnosis.verdict is Verdict.HEALTHY and again.snapshot.run_id == run.name
    assert alive(long_lived) == long_lived


def test_a_python_run_whose_stdout_is_a_file_is_adopted_by_its_stdout_and_a_checkpoint_write_is_seen(made, by_hand, tmp_path):
    target = made()
    log = tmp_path / "py.log"
    stopped = Path(target.state_path) / "stopped"
    stopped.parent.mkdir(parents=True, exist_ok=True)
    stopped.write_text("1700000000.5\n")  # an earlier `relaunch stop`: the run started by hand since replaces it
    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(PY_STEPPER)} > {shlex.quote(str(log))}"
    pane = by_hand(target.tmux_session, command, target.repo_dir)
    stepping(log)
    first = collect_snapshot(target)
    assert first.stopped_at == 1700000000.5 and not first.adopted
    assert first.foreign_log == str(log) and first.foreign and first.foreign[0].split()[0] == str(pane.pid)
    result = check_health.fn(target)
    assert result.diagnosis.verdict is Verdict.HEALTHY, result.diagnosis
    assert (run_folder(target) / "adopted").read_text().strip() == "stdout"
    assert not stopped.exists() and result.snapshot.stopped_at is None
    ckpt = Path(target.checkpoint_dir) / "step_5"
    ckpt.mkdir(parents=True)
    (ckpt / "model.pt").write_bytes(b"x" * 1024)
    snap = collect_snapshot(target)
    assert snap.checkpoint_mtime_epoch == pytest.approx((ckpt / "model.pt").stat().st_mtime, abs=0.01)
    assert pane.alive()


@pytest.mark.parametrize("shape", ["a program in its own session", "a program typed into an interactive shell"])
def test_a_session_holding_a_program_that_is_no_trainer_is_reported_not_adopted_and_left_running(made, by_hand, shape):
    target = made()
    if shape == "a program in its own session":
        pane = by_hand(target.tmux_session, "tail -f /dev/null", target.repo_dir)
        # tmux's `bash -c` becomes tail (exec): the same process, read again once it has.
        program = wait_for(lambda: (p := proc(pane.pid)) is not None and p.argv[:1] == ("tail",) and p, "tail to start")
    else:
        pane = by_hand(target.tmux_session, "bash -i", target.repo_dir)  # what tmux starts with no command: a shell
        subprocess.run(["tmux", "send-keys", "-t", f"={target.tmux_session}:", "sleep infinity", "Enter"], check=True)
        program = wait_for(lambda: next((p for p in tree(pane.pid)[1:] if p.argv[:1] == ("sleep",)), None), "sleep to start")
    snap = collect_snapshot(target)
    assert snap.foreign == [f"{program.pid} {' '.join(program.argv)}"], "the program is named, not the shell around it"
    assert snap.foreign_log is None
    result = check_health.fn(target, timeout_seconds=5)
    assert (result.diagnosis.verdict, result.diagnosis.cause) == (Verdict.UNMANAGED, Cause.NOT_A_TRAINER), result.diagnosis
    assert not (Path(target.state_path) / "current").exists(), "nothing was adopted"
    with pytest.raises(CommandFailed) as refused:
        adopt_run(target)
    assert refused.value.exit_code == 24 and "no log found" in str(refused.value)
    assert pane.alive() and program.alive()


def test_a_window_the_user_opens_in_relaunchs_own_session_is_not_foreign(made):
    target = made()
    record, _ = launch.fn(target, 1)
    window = proc(open_window(target.tmux_session, "tail -f /dev/null"))
    snap = collect_snapshot(target)
    assert snap.pid_alive and snap.foreign == [] and not snap.adopted
    with pytest.raises(CommandFailed) as refused:
        adopt_run(target)
    assert refused.value.exit_code == 21, refused.value
    assert window is not None and window.alive()


def test_a_log_renamed_under_the_live_trainer_is_followed(made, by_hand, tmp_path):
    target = made()
    log = tmp_path / "train.log"
    by_hand(target.tmux_session, f"bash stepper.sh 2>&1 | tee {shlex.quote(str(log))}", target.repo_dir)
    stepping(log)
    assert check_health.fn(target).snapshot.adopted
    rotated = log.with_name("train.log.1")
    log.rename(rotated)  # rotation by rename: tee goes on writing the same file, now under the new name
    at = last_step(rotated)
    stepping(rotated, beyond=at + 2)
    snap = collect_snapshot(target)
    assert snap.log_followed == str(rotated)
    steps = [int(m[1]) for line in snap.log_tail if (m := re.match(r"step=(\d+)", line))]
    assert steps and steps[-1] > at + 2, "the poll reads the lines written after the rename"
    assert check_health.fn(target).diagnosis.verdict is Verdict.HEALTHY
    # After the trainer's death the poll still reads the file it wrote last, not the emptied old name.
    pid = snap.pid
    kill_session(target.tmux_session)
    wait_for(lambda: proc(pid) is None, "the trainer to end with its session")
    dead = collect_snapshot(target)
    assert not dead.pid_alive and dead.log_followed == str(rotated)
    assert any(line.startswith(f"step={last_step(rotated)} ") for line in dead.log_tail[-2:])


def test_the_log_of_relaunchs_own_run_renamed_under_it_is_followed(made):
    target = made()
    record, _ = launch.fn(target, 1)
    log = Path(record.log_path)
    at = stepping(log)
    rotated = log.with_name(log.name + ".1")
    log.rename(rotated)
    stepping(rotated, beyond=at + 2)
    snap = collect_snapshot(target)
    assert snap.pid_alive and snap.log_followed == str(rotated)
    steps = [int(m[1]) for line in snap.log_tail if (m := re.match(r"step=(\d+)", line))]
    assert steps and steps[-1] > at + 2, "the poll reads the lines written after the rename"


# A trainer in Python that logs to a file of its own in the target's log_dir (as `logging` does) while its output goes
# to the terminal: no tee, no stdout to a file. sys.argv[1]: the log.
PY_LOGGER = (
    "import sys, time\n"
    "log = open(sys.argv[1], 'a')\n"
    "for i in range(1, 100000):\n"
    "    print(f'step={i} loss=3.6441 lr=3.96e-04', file=log, flush=True)\n"
    "    print('.', end='', flush=True)\n"
    "    time.sleep(0.2)\n"
)


def test_a_trainer_restarted_by_hand_in_a_new_window_beside_a_persons_idle_shell_is_adopted(made, by_hand):
    """Every pane of the session is read: the person's idle shell is no trainer, and the trainer in the window they
    opened, logging to a file of its own in log_dir (its output to the terminal), is the run: adopted, judged healthy."""
    target = made()
    shell = by_hand(target.tmux_session, "bash -i", target.repo_dir)
    log = Path(target.log_dir) / "by_hand.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = f"cd {shlex.quote(target.repo_dir)} && exec {shlex.quote(sys.executable)} -c {shlex.quote(PY_LOGGER)} {shlex.quote(str(log))}"
    trainer = proc(open_window(target.tmux_session, command))
    stepping(log)
    result = check_health.fn(target)
    assert result.diagnosis.verdict is Verdict.HEALTHY, result.diagnosis
    assert result.snapshot.adopted and result.snapshot.pid == trainer.pid
    run = run_folder(target)
    assert (run / "adopted").read_text().strip() == "open" and (run / "log_path").read_text().strip() == str(log)
    assert shell.alive() and trainer.alive()


def test_a_run_restarted_by_hand_after_relaunchs_own_run_died_is_adopted_not_recovered(made, by_hand, tmp_path):
    target = made(env={"EXIT_AT": "3", "EXIT_CODE": "1"})
    launch.fn(target, 1)
    wait_for(lambda: collect_snapshot(target).exit_code == 1 and not tmux_alive(target.tmux_session), "relaunch's run to die")
    log = tmp_path / "again.log"
    # The person restarts it by hand, in the same session name, without EXIT_AT.
    pane = by_hand(target.tmux_session, f"env -u EXIT_AT bash stepper.sh 2>&1 | tee {shlex.quote(str(log))}", target.repo_dir)
    stepping(log)
    result = check_health.fn(target)
    assert result.diagnosis.verdict is Verdict.HEALTHY and result.snapshot.adopted and result.snapshot.pid == pane.pid
    assert pane.alive()


def test_a_run_started_by_hand_beside_relaunchs_live_trainer_is_not_adopted_and_neither_is_touched(made, by_hand, tmp_path):
    target = made()
    launch.fn(target, 1)
    trainer = proc(collect_snapshot(target).pid)
    lose_pane(target.state_path, target.tmux_session)  # the pane gone without a hangup: relaunch's setsid trainer lives on
    log = tmp_path / "second.log"
    pane = by_hand(target.tmux_session, f"bash stepper.sh 2>&1 | tee {shlex.quote(str(log))}", target.repo_dir)
    stepping(log)
    snap = collect_snapshot(target)
    assert snap.pid_alive and snap.foreign and snap.foreign_log == str(log)
    with pytest.raises(CommandFailed) as refused:
        adopt_run(target)
    assert refused.value.exit_code == 22 and "two trainers" in str(refused.value)
    result = check_health.fn(target, timeout_seconds=5)
    assert (result.diagnosis.verdict, result.diagnosis.cause) == (Verdict.UNMANAGED, Cause.TWO_TRAINERS), result.diagnosis
    assert not result.snapshot.adopted and result.snapshot.run_id.endswith("-a1")
    assert trainer is not None and trainer.alive() and pane.alive()


def test_an_old_kernel_line_is_not_reported_for_a_run_relaunch_has_no_record_of(made, by_hand):
    # A line the poll's kernel filter keeps (oom_reaper) but no verdict reads as a kill: harmless to other tests.
    line = f"relaunch-test {uuid.uuid4().hex[:8]}: oom_reaper off"
    why_not = write_kernel_line(line)
    if why_not:
        cannot_run_here(why_not)  # a skip on a developer machine; in CI (CI=true) a failure
    target = made()
    by_hand(target.tmux_session, "tail -f /dev/null", target.repo_dir)
    snap = collect_snapshot(target)
    assert snap.kernel_readable is True and snap.foreign
    assert not any(line in k for k in snap.kernel_lines), snap.kernel_lines


def test_relaunch_adopt_with_log_records_a_run_whose_log_cannot_be_found(made, by_hand, tmp_path):
    target = made()
    log = tmp_path / "own.log"
    # The trainer opens its log itself; its stdout is the pane: no tee, no file on stdout.
    code = PY_STEPPER.replace("print(", "f.write(").replace(", flush=True)", " + '\\n'); f.flush()")
    code = f"f = open({str(log)!r}, 'a')\n" + code
    pane = by_hand(target.tmux_session, f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}", target.repo_dir)
    stepping(log)
    snap = collect_snapshot(target)
    assert snap.foreign and snap.foreign_log is None
    target_file = tmp_path / "target.yaml"
    target_file.write_text(json.dumps(target.model_dump(mode="json", exclude_defaults=True)))
    with pytest.raises(CommandFailed) as refused:
        adopt_run(target, str(tmp_path / "nope.log"))
    assert refused.value.exit_code == 25 and "nope.log is not a regular file" in str(refused.value)
    assert not (Path(target.state_path) / "current").exists()
    out = subprocess.run([RELAUNCH, "adopt", str(target_file), "--log", str(log), "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    adoption = json.loads(out.stdout)
    assert (adoption["pid"], adoption["how"], adoption["log_path"]) == (pane.pid, "--log", str(log))
    assert check_health.fn(target).diagnosis.verdict is Verdict.HEALTHY
    assert pane.alive()


def test_adoption_refuses_a_missing_session_and_another_targets_state_folder(made, by_hand, tmp_path):
    target = made()
    with pytest.raises(CommandFailed) as refused:
        adopt_run(target)
    assert refused.value.exit_code == 23 and f"no tmux session {target.tmux_session}" in str(refused.value)
    log = tmp_path / "t.log"
    pane = by_hand(target.tmux_session, f"bash stepper.sh 2>&1 | tee {shlex.quote(str(log))}", target.repo_dir)
    owner = Path(target.state_path) / "target"
    owner.parent.mkdir(parents=True, exist_ok=True)
    owner.write_text("other /elsewhere other\n")
    with pytest.raises(CommandFailed) as refused:
        adopt_run(target)
    assert refused.value.exit_code == 20 and "belongs to another target (other /elsewhere other)" in str(refused.value)
    assert not (Path(target.state_path) / "current").exists() and pane.alive()
