"""Work, a wait, a pause or a hang, told from what the processes do (issue 50): the progress record the recorder keeps
beside a real trainer (relaunch/host/recorder.sh) and the rules that read it (relaunch/judging/progress.py).

Each trainer below steps three times, says it is ready, and then takes one shape for good: one long C call, a busy
non-Python child, a file lock another live process holds, a FIFO nobody writes, an Event nobody sets, or a person's
pause. Where a run must live, its trainer's PID and start time are asserted unchanged after the checks. The shapes that
must never be stopped are run with both cores busy too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relaunch.config import Target, Thresholds
from relaunch.judging.findings import Diagnosis
from relaunch.tasks.health import HealthResult, check_health
from relaunch.tasks.launch import launch
from relaunch.tasks.stop import stop
from relaunch.testing.faults import making, start_time, wait_for
from relaunch.vocabulary import Cause, Verdict
from tests.handmade import start_by_hand, tmux

SHAPES = r"""
import fcntl, hashlib, os, subprocess, threading, time
shape = os.environ["SHAPE"]
for step in range(1, 4):
    print(f"step={step} loss=3.6441 | (20.0Ktok/s)", flush=True)
    time.sleep(0.2)
open(os.environ["READY"], "w").close()
if shape == "pbkdf2":
    hashlib.pbkdf2_hmac("sha256", b"x", b"salt", 10**9)  # minutes of CPU in one C call, no Python frame moving
elif shape == "child":
    subprocess.run("head -c 500000000000 /dev/zero | sha256sum", shell=True)  # the work is a child's; Popen.wait here
elif shape == "fcntl":
    f = open(os.environ["LOCK"], "w"); fcntl.lockf(f, fcntl.LOCK_EX)
elif shape == "flock":
    f = open(os.environ["LOCK"], "w"); fcntl.flock(f, fcntl.LOCK_EX)
elif shape == "fifo":
    once = os.environ.get("HANG_ONCE")
    if not once or not os.path.exists(once):
        once and open(once, "w").close()
        open(os.environ["FIFO"]).read()
    while True:  # the relaunched run steps on
        step += 1; print(f"step={step} loss=3.6441 | (20.0Ktok/s)", flush=True); time.sleep(0.2)
elif shape == "event":
    threading.Event().wait()
elif shape == "saves":
    import signal, sys
    def save(*_):
        open(os.environ["SAVED"], "w").write("saved on SIGTERM\n"); sys.exit(0)
    signal.signal(signal.SIGTERM, save)
time.sleep(3600)
"""
FLOOR_SECONDS = 3.0


@pytest.fixture
def made(tmp_path: Path) -> Iterator:
    with making(tmp_path) as make:
        yield make


@pytest.fixture(params=["quiet", "loaded"])
def load(request: pytest.FixtureRequest) -> Iterator[str]:
    """Both cores busy (two spinning processes) for the loaded variant: the verdicts must not change."""
    hogs = []
    if request.param == "loaded":
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    yield request.param
    for hog in hogs:
        hog.kill()
        hog.wait()


def shaped(made, tmp_path: Path, shape: str, **env: str) -> tuple[Target, Path]:
    trainer = tmp_path / "shapes.py"
    trainer.write_text(SHAPES)
    ready = tmp_path / f"ready-{shape}"
    thresholds = Thresholds(
        startup_grace_seconds=1,
        poll_interval_seconds=0.5,
        settle_timeout_seconds=60,
        healthy_steps=3,
        stall_window_floor_seconds=FLOOR_SECONDS,
    )
    t = made(launch_command=f"{sys.executable} -u {trainer}", env={"SHAPE": shape, "READY": str(ready), **env}, thresholds=thresholds)
    launch.fn(t, 1)
    wait_for(ready.exists, 60, f"the {shape} trainer to take its shape")
    return t, ready


def trainer_of(target: Target) -> tuple[int, str]:
    run = Path(target.state_path) / "runs" / (Path(target.state_path) / "current").read_text().strip()
    pid, start = (run / "pid").read_text().split()[:2]
    return int(pid), start


def record_spans(target: Target, seconds: float) -> None:
    """Wait until the run's progress record holds samples spanning `seconds` since now (the recorder's own clock)."""
    run = Path(target.state_path) / "runs" / (Path(target.state_path) / "current").read_text().strip()
    since = time.time()

    def spanned() -> bool:
        stamps = [float(line.split()[1]) for line in (run / "progress").read_text().splitlines() if line.startswith("@ ")]
        return bool(stamps) and stamps[-1] - since >= seconds

    wait_for(spanned, 60 + 4 * seconds, f"the progress record to span {seconds} s more")


def checks(target: Target, seconds: float) -> list[HealthResult]:
    results: list[HealthResult] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end or not results:
        results.append(check_health.fn(target))
    return results


def never_stopped(target: Target, results: list[HealthResult], pid: int, start: str) -> None:
    stalled: list[Diagnosis] = [r.diagnosis for r in results if r.diagnosis.verdict is Verdict.STALLED]
    assert not stalled, f"a working run was called stalled: {stalled[0].summary}: {stalled[0].evidence}"
    assert start_time(pid) == start, f"the trainer PID {pid} is not the one launched"


@pytest.mark.parametrize("shape", ["pbkdf2", "child"])
def test_a_trainer_working_inside_one_long_c_call_or_through_a_busy_child_is_never_called_stalled(made, tmp_path, shape, load):
    t, _ = shaped(made, tmp_path, shape)
    pid, start = trainer_of(t)
    record_spans(t, FLOOR_SECONDS)
    results = checks(t, 3 * FLOOR_SECONDS)
    never_stopped(t, results, pid, start)
    assert any("its tree works" in line for r in results for line in r.diagnosis.evidence) or all(
        r.diagnosis.verdict is Verdict.HEALTHY for r in results
    ), [r.diagnosis.summary for r in results]


def stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def test_a_trainer_a_person_paused_with_sigstop_is_called_paused_and_left_alive(made, tmp_path):
    t, _ = shaped(made, tmp_path, "sleep")
    pid, start = trainer_of(t)
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: stopped(pid), 10, "the trainer to stop")
    record_spans(t, 2 * FLOOR_SECONDS)  # longer than its window: a pause is never a hang however long it lasts
    result = check_health.fn(t)
    assert result.diagnosis.verdict is Verdict.PAUSED, (result.diagnosis.summary, result.diagnosis.evidence)
    assert any(f"kill -CONT {pid}" in line for line in result.diagnosis.evidence), result.diagnosis.evidence
    assert start_time(pid) == start
    os.kill(pid, signal.SIGCONT)
    wait_for(lambda: check_health.fn(t).diagnosis.verdict is not Verdict.PAUSED, 30, "the resumed run to be judged as running")
    assert start_time(pid) == start


def test_a_run_started_by_hand_in_tmux_and_suspended_with_ctrl_z_is_called_paused_and_left_alive(made, tmp_path):
    trainer = tmp_path / "shapes.py"
    trainer.write_text(SHAPES)
    ready, log = tmp_path / "ready", tmp_path / "by-hand.log"
    thresholds = Thresholds(
        startup_grace_seconds=1, poll_interval_seconds=0.5, settle_timeout_seconds=60, stall_window_floor_seconds=FLOOR_SECONDS
    )
    t = made(launch_command=f"{sys.executable} -u {trainer}", thresholds=thresholds)
    # Typed into the pane's interactive shell, as a person does: its job control is what Ctrl-Z stops (a command given
    # to new-session itself runs in an orphaned process group, where the kernel drops SIGTSTP).
    start_by_hand(t.tmux_session, "bash --norc --noprofile -i", t.repo_dir, {"SHAPE": "sleep", "READY": str(ready), "PS1": "$ "})
    tmux("send-keys", "-t", f"={t.tmux_session}:", f"{sys.executable} -u {trainer} 2>&1 | tee {log}", "Enter")
    wait_for(ready.exists, 60, "the trainer started by hand")
    wait_for(lambda: check_health.fn(t).snapshot.adopted, 60, "its adoption")
    pid, start = trainer_of(t)
    tmux("send-keys", "-t", f"={t.tmux_session}:", "C-z")
    wait_for(lambda: stopped(pid), 10, "Ctrl-Z to stop the trainer")
    record_spans(t, 2 * FLOOR_SECONDS)
    result = check_health.fn(t)
    assert result.diagnosis.verdict is Verdict.PAUSED, (result.diagnosis.summary, result.diagnosis.evidence)
    assert start_time(pid) == start


@pytest.mark.parametrize("kind", ["fcntl", "flock"])
def test_a_trainer_waiting_on_a_lock_another_live_job_holds_is_escalated_naming_the_holder_never_stopped(made, tmp_path, kind):
    lock = tmp_path / f"{kind}.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import fcntl,sys,time; f=open({str(lock)!r},'w'); fcntl.{'lockf' if kind == 'fcntl' else 'flock'}(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(3600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        t, _ = shaped(made, tmp_path, kind, LOCK=str(lock))
        pid, start = trainer_of(t)
        result = wait_for(lambda: (r := check_health.fn(t)).diagnosis.verdict is Verdict.STALLED and r, 60, "a verdict on the wait")
        d = result.diagnosis
        assert d.cause is Cause.BLOCKED, (d.summary, d.evidence)
        assert any(f"held by PID {holder.pid}" in line for line in d.evidence), d.evidence
        assert start_time(pid) == start
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("shape", ["fifo", "event"])
def test_a_trainer_blocked_for_good_on_a_fifo_nobody_writes_or_an_event_nobody_sets_is_a_hang(made, tmp_path, shape, load):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t, _ = shaped(made, tmp_path, shape, FIFO=str(fifo))
    result = wait_for(lambda: (r := check_health.fn(t)).diagnosis.verdict is Verdict.STALLED and r, 60, "a stalled verdict")
    d = result.diagnosis
    assert d.cause is None, (d.cause, d.evidence)
    assert any("no CPU, no I/O and no GPU activity in its whole tree" in line for line in d.evidence), d.evidence


def test_a_hang_that_began_long_before_the_check_looked_is_judged_on_its_first_look_from_the_record(made, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t, _ = shaped(made, tmp_path, "fifo", FIFO=str(fifo))
    record_spans(t, 2 * FLOOR_SECONDS)  # the hang is older than its window before any check looks
    result = check_health.fn(t)
    assert result.diagnosis.verdict is Verdict.STALLED, (result.diagnosis.summary, result.diagnosis.evidence)
    assert result.polls == 1, f"watched for {result.seconds:.1f} s over {result.polls} polls: the record was not read"


def test_the_recorder_ends_by_itself_with_its_run(made, tmp_path):
    t, _ = shaped(made, tmp_path, "sleep")
    run = Path(t.state_path) / "runs" / (Path(t.state_path) / "current").read_text().strip()
    rpid = wait_for(lambda: (run / "recorder_pid").exists() and int((run / "recorder_pid").read_text().split()[0]), 30, "a recorder")
    pid, _ = trainer_of(t)
    os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: not Path(f"/proc/{rpid}").exists() or "Z" in Path(f"/proc/{rpid}/stat").read_text().rsplit(")", 1)[1][:3],
        30,
        "the recorder to end",
    )


def test_a_stop_of_a_paused_trainer_continues_it_so_it_saves_on_its_sigterm_within_the_grace(made, tmp_path):
    saved = tmp_path / "saved"
    t, _ = shaped(made, tmp_path, "saves", SAVED=str(saved))
    t = t.model_copy(update={"stop_grace_seconds": 30.0})
    pid, _ = trainer_of(t)
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: stopped(pid), 10, "the trainer to stop")
    record = stop.fn(t, deliberate=True)
    assert saved.exists(), "the paused trainer never ran its SIGTERM handler: it was SIGKILLed with the TERM pending"
    assert record.seconds < 15, f"the stop waited {record.seconds:.1f} s: the grace ran out on a stopped process"


def test_the_watch_hands_a_hang_to_recovery_by_itself_within_the_window_and_the_relaunched_run_steps(made, tmp_path, prefect_harness):
    from relaunch.flows.watch import Watch
    from relaunch.judging.watching import Seen

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t, ready = shaped(made, tmp_path, "fifo", FIFO=str(fifo), HANG_ONCE=str(tmp_path / "hung-once"))
    hung_at = ready.stat().st_mtime
    first = (Path(t.state_path) / "current").read_text().strip()
    said: list[tuple[float, str]] = []
    watch = Watch([], lambda line: said.append((time.time(), line)), targets=[t])
    runner = threading.Thread(target=watch.run, args=(1.0,), daemon=True)
    runner.start()
    try:
        wait_for(lambda: any("stands still" in line for _, line in said), 60, "the watch to hand the hang over")
        handed = next(at for at, line in said if "stands still" in line)
        wait_for(lambda: any("recovery ended" in line for _, line in said), 120, "the recovery to end")
    finally:
        watch.stopping.set()
        runner.join(timeout=120)
    assert handed - hung_at >= FLOOR_SECONDS, "handed over before a window of stillness"
    assert handed - hung_at <= FLOOR_SECONDS + 5 + 2 * t.thresholds.progress_sample_seconds, f"{handed - hung_at:.1f} s after the hang"
    now = (Path(t.state_path) / "current").read_text().strip()
    assert now != first, [line for _, line in said]
    assert watch.watched[t.name].last is not Seen.HUNG
    wait_for(lambda: check_health.fn(t).diagnosis.verdict is Verdict.HEALTHY, 60, "the relaunched run to step")


@pytest.mark.parametrize("shape", ["pbkdf2", "sleep"])
def test_the_watch_never_hands_over_a_working_or_a_paused_run(made, tmp_path, shape):
    from relaunch.flows.watch import Watch

    t, _ = shaped(made, tmp_path, shape)
    pid, start = trainer_of(t)
    if shape == "sleep":
        os.kill(pid, signal.SIGSTOP)
    said: list[str] = []
    watch = Watch([], said.append, targets=[t])
    watch.run(0.5, rounds=int(3 * FLOOR_SECONDS / 0.5))
    assert not any("stands still" in line or "starts now" in line for line in said), said
    assert start_time(pid) == start
    if shape == "sleep":
        os.kill(pid, signal.SIGCONT)


def test_a_pause_is_told_once_per_run_however_many_checks_see_it(made, tmp_path, prefect_harness, monkeypatch):
    from relaunch.flows import recover

    told: list[str] = []
    real = recover.emit
    monkeypatch.setattr(recover, "emit", lambda event, *a, **k: (told.append(event), real(event, *a, **k))[1])
    t, _ = shaped(made, tmp_path, "sleep")
    pid, start = trainer_of(t)
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: stopped(pid), 10, "the trainer to stop")
    for _ in range(3):
        assert recover.checked(t, 1).diagnosis.verdict is Verdict.PAUSED
    assert told.count("relaunch.run.paused") == 1, told
    assert told.count("relaunch.verdict.paused") == 3, told
    os.kill(pid, signal.SIGCONT)
    assert start_time(pid) == start
