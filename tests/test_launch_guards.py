"""launch.sh's guards and the supervisor's promises, on real tmux, bash, Python and a real full tmpfs.

Each refusal is reached through the launch task itself and leaves whatever was running exactly as it was
(same PIDs with the same start times, still stepping). The supervisor's trainer never depends on log space,
gets unbuffered Python and the target's marker, and a trainer its command backgrounded is followed.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from relaunch.errors import CommandFailed
from relaunch.plans.launch import trainer_env
from relaunch.plans.warm_cache import foreign_entries
from relaunch.runlayout import state_identity
from relaunch.tasks.health import collect_snapshot
from relaunch.tasks.launch import launch, launch_advice
from relaunch.tasks.stop import stop
from relaunch.testing.faults import kill_group, making, start_time, tmpfs, wait_for
from relaunch.testing.targets import shell_target, tmux_alive

PYTHON = sys.executable


@pytest.fixture
def made(tmp_path: Path) -> Iterator:
    with making(tmp_path) as make:
        yield make


def run_record(target) -> Path:
    state = Path(target.state_path)
    return state / "runs" / (state / "current").read_text().strip()


def recorded(path: Path) -> tuple[int, str]:
    pid, start = path.read_text().split()[:2]
    return int(pid), start


def environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").partition("=")[::2] for e in entries if e)


def refused(target, code: int) -> CommandFailed:
    """The launch task's failure with launch.sh's exit code `code`; nothing else counts as the refusal. Its one
    "what to do" is the advice for that code, and no other code's."""
    with pytest.raises(CommandFailed) as info:
        launch.fn(target, 1)
    assert info.value.exit_code == code, str(info.value)
    said = str(info.value)
    assert said.count("what to do:") == 1 and said.endswith(launch_advice(target)[code]), said
    others = [text for other, text in launch_advice(target).items() if other not in (code, None)]
    assert not [text for text in others if text in said], f"exit {code}'s refusal also advises for other codes: {said}"
    return info.value


def nothing_launched(target, runs_before: set[str]) -> None:
    runs = Path(target.state_path) / "runs"
    assert ({p.name for p in runs.iterdir()} if runs.is_dir() else set()) == runs_before, "a refused launch made a run folder"
    assert not tmux_alive(target.tmux_session), "a refused launch started its tmux session"


def stepper(repo: str, env: dict[str, str] | None = None, session: bool = True) -> subprocess.Popen:
    """A trainer this test starts by hand (relaunch/testing/targets.py's STEPPER), in its own session so it can be reaped."""
    return subprocess.Popen(
        ["bash", "stepper.sh"],
        cwd=repo,
        env={**os.environ, "STEP_SECONDS": "0.05", **(env or {})},
        stdout=subprocess.DEVNULL,
        start_new_session=session,
    )


def keeps_stepping(proc: subprocess.Popen, start: str) -> None:
    """Still the same process (start time), and still alive: a refusal did not touch it."""
    assert proc.poll() is None and start_time(proc.pid) == start, f"PID {proc.pid} was touched by a refused launch"


# ---------------------------------------------------------------------------------------------
# The supervisor: the trainer's life does not depend on the log.

TRAINER = textwrap.dedent(
    """
    import pathlib, sys, time
    progress, stop = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    i = 0
    while not stop.exists():
        i += 1
        print(f"step={i} loss=1.0 " + "x" * int(sys.argv[3]))
        progress.write_text(str(i))
        time.sleep(float(sys.argv[4]))
    sys.exit(7)
    """
)


def python_trainer(tmp_path: Path, pad: int, pace: float) -> tuple[str, Path, Path]:
    """A Python trainer printing a step line (padded to `pad` bytes) every `pace` s until a flag file appears, then exit 7."""
    script, progress, flag = tmp_path / "train.py", tmp_path / "progress", tmp_path / "stop-now"
    script.write_text(TRAINER)
    return f"{shlex.quote(PYTHON)} {script} {progress} {flag} {pad} {pace}", progress, flag


def progress_of(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def test_a_full_log_disk_leaves_the_trainer_stepping_and_the_log_resumes_when_space_returns(made, tmp_path):
    with tmpfs(tmp_path / "logdisk", "64k") as disk:
        command, progress, flag = python_trainer(tmp_path, pad=1000, pace=0.01)
        t = made(log_dir=str(disk), launch_command=command)
        record, _ = launch.fn(t, 1)
        log = Path(record.log_path)
        wait_for(lambda: os.statvfs(disk).f_bavail == 0, 30, "the trainer's output to fill the 64 KiB log disk")
        full_at = progress_of(progress)
        # With a `>> log` redirect, Python's print raised OSError (No space left on device) here and the trainer died.
        wait_for(lambda: progress_of(progress) > full_at + 100, 30, "the trainer to go on stepping with its log disk full")
        assert start_time(record.pid) is not None, "the trainer died of its full log disk"
        assert not (run_record(t) / "exit_code").exists()
        os.truncate(log, 0)  # what a person freeing the disk does

        # The trainer's new lines follow the writer's note at once: at 100 KB/s they may fill the 64 KiB again within
        # a second (on a loaded host before this test looks), so what is awaited is new step lines after the note, not
        # a step number counted from when the test looked.
        def steps_after_note() -> list[int]:
            return [int(n) for n in re.findall(r"step=(\d+) ", log.read_text(errors="replace").partition("could not be written from")[2])]

        wait_for(steps_after_note, 30, "step lines to reach the log after the writer's note")
        assert min(steps_after_note()) > full_at, "new lines, not the ones the full disk lost"
        flag.touch()
        exit_code = run_record(t) / "exit_code"
        wait_for(exit_code.exists, 30, "the trainer to exit and its exit code to be recorded")
        assert exit_code.read_text().strip() == "7", "the exit code recorded is not the trainer's own"
        writer, wstart = recorded(run_record(t) / "log_writer_pid")
        wait_for(lambda: start_time(writer) != wstart, 10, "the log writer to end with the trainer")


def test_the_trainer_gets_unbuffered_python_and_the_target_marker_and_the_log_writer_carries_no_marker(made, tmp_path):
    # One step line, then nothing until the flag: block-buffered, the line would reach the log only at the exit.
    command, _, flag = python_trainer(tmp_path, pad=0, pace=3600)
    t = made(launch_command=command)
    record, _ = launch.fn(t, 1)
    wait_for(lambda: "step=1 loss" in Path(record.log_path).read_text(), 20, "the trainer's first step line in the log as printed")
    # relaunch's own entry: the tmux server's environment may hold PYTHONUNBUFFERED=1 already (it does on this machine).
    assert "PYTHONUNBUFFERED=1" in (run_record(t) / "spec").read_text().split("\0")
    trainer = environ(record.pid)
    assert trainer["PYTHONUNBUFFERED"] == "1"
    assert trainer["RELAUNCH_TARGET"] == t.state_path and trainer["RELAUNCH_RUN"] == str(run_record(t))
    writer, _ = recorded(run_record(t) / "log_writer_pid")
    assert writer != record.pid and not {"RELAUNCH_RUN", "RELAUNCH_TARGET"} & environ(writer).keys()


def test_pythonunbuffered_is_left_to_the_target_when_it_sets_it_or_turns_it_off(tmp_path):
    base = shell_target(tmp_path / "a")
    assert trainer_env(base)["PYTHONUNBUFFERED"] == "1"
    assert trainer_env(base.model_copy(update={"env": {"PYTHONUNBUFFERED": ""}}))["PYTHONUNBUFFERED"] == ""
    assert "PYTHONUNBUFFERED" not in trainer_env(base.model_copy(update={"unbuffered": False}))


def test_tritons_own_cache_lives_inside_the_targets_compile_cache_so_moving_the_cache_aside_takes_it_too(tmp_path):
    # On the H200 Triton built its driver module under $HOME/.triton/cache, outside TORCHINDUCTOR_CACHE_DIR, and that
    # module cut in half killed every start with SIGBUS (tests/fixtures/logs/gpu/cache_so_half.log).
    base = shell_target(tmp_path / "a")
    assert trainer_env(base)["TRITON_HOME"] == f"{base.inductor_cache_dir}/triton_home"
    assert not foreign_entries("d", ["triton_home", "fxgraph", "triton"]), "relaunch's own Triton home is compile cache"
    for own in ({"TRITON_HOME": "/shared/triton"}, {"TRITON_CACHE_DIR": "/shared/triton/cache"}):
        env = trainer_env(base.model_copy(update={"env": own}))
        assert env.get("TRITON_HOME") == own.get("TRITON_HOME"), "a target that places Triton's cache itself keeps its place"


@pytest.mark.parametrize(
    "command",
    ["nohup bash stepper.sh > backgrounded.log 2>&1 &", "bash -c 'setsid bash stepper.sh &'"],
    ids=["nohup", "setsid"],
)
def test_a_trainer_the_command_backgrounds_is_followed_and_its_death_leaves_no_exit_code(made, command):
    t = made(launch_command=command, env={"STEP_SECONDS": "0.05"})
    launch.fn(t, 1)
    run = run_record(t)
    log = Path((run / "log_path").read_text().strip())
    wait_for(lambda: "lives on (backgrounded): following it" in log.read_text(), 20, "the supervisor to follow the backgrounded trainer")
    pid, start = recorded(run / "pid")
    assert "stepper.sh" in Path(f"/proc/{pid}/cmdline").read_text(), "RUN/pid does not name the backgrounded trainer"
    snap = collect_snapshot(t)
    assert snap.pid_alive and snap.exit_code is None, "a backgrounded trainer that lives was judged dead"
    if "setsid" in command:  # its output still reaches the log, through the writer
        size = log.stat().st_size
        wait_for(lambda: log.stat().st_size > size and "step=" in log.read_text(), 10, "the backgrounded trainer's steps in the log")
    os.kill(pid, signal.SIGKILL)  # the recorded PID, with its start time checked above
    wait_for((run / "detached").exists, 20, "the supervisor to note the backgrounded trainer's end")
    assert not (run / "exit_code").exists(), "an exit code was written though the backgrounded trainer's code is unknowable"
    assert "launch_command exited 0" in (run / "detached").read_text()
    assert not collect_snapshot(t).pid_alive


# ---------------------------------------------------------------------------------------------
# launch.sh's refusals: each leaves what runs as it was.


@pytest.mark.parametrize("marker", ["target", "older run", "legacy run"])
def test_launch_refuses_beside_a_live_process_carrying_the_targets_marker(made, marker):
    t = made()
    env = {
        "target": {"RELAUNCH_TARGET": t.state_path},
        "older run": {"RELAUNCH_RUN": f"{t.state_path}/runs/20240101T000000Z-1-0000"},
        "legacy run": {"RELAUNCH_RUN": f"{t.legacy_state_path}/runs/20240101T000000Z-1-0000"},
    }[marker]
    proc = stepper(t.repo_dir, env)
    try:
        wait_for(lambda: start_time(proc.pid) and env.items() <= environ(proc.pid).items(), 10, "the marked trainer to start")
        start = start_time(proc.pid)
        error = refused(t, 18)
        assert f"PID {proc.pid}: bash stepper.sh" in str(error), "the refusal does not name the marked process"
        keeps_stepping(proc, start)
        nothing_launched(t, set())
    finally:
        kill_group(proc)


def test_launch_refuses_while_another_process_has_checkpoint_files_open(made):
    t = made()
    Path(t.checkpoint_dir).mkdir(parents=True)
    held = Path(t.checkpoint_dir) / "step_5.pt"
    # A trainer started by hand with a checkpoint open for writing (exec keeps fd 3 across it).
    proc = subprocess.Popen(
        ["bash", "-c", 'exec 3>>"$1"; exec bash stepper.sh', "hand", str(held)],
        cwd=t.repo_dir,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: "stepper.sh" in Path(f"/proc/{proc.pid}/cmdline").read_text(), 10, "the hand-started trainer")
        start = start_time(proc.pid)
        error = refused(t, 19)
        assert f"PID {proc.pid}: bash stepper.sh" in str(error) and t.checkpoint_dir in str(error)
        keeps_stepping(proc, start)
        nothing_launched(t, set())
    finally:
        kill_group(proc)


HOLDER = "import sys, time\nf = open(sys.argv[1], sys.argv[2])\nprint('held', flush=True)\ntime.sleep(600)\n"


@pytest.mark.parametrize("mode", ["rb", "r+b", "ab"])
def test_a_process_holding_a_checkpoint_open_blocks_a_launch_only_when_it_writes_there(made, tmp_path, mode):
    """A backup reading the checkpoint (open read-only) is no second trainer: the launch goes on beside it and the
    reader reads on. A process with a checkpoint file open for writing (read-write or append) is refused by exit 19."""
    t = made()
    Path(t.checkpoint_dir).mkdir(parents=True)
    held = Path(t.checkpoint_dir) / "step_5.pt"
    with zipfile.ZipFile(held, "w") as z:  # torch.save's format: a zip archive
        z.writestr("step_5/data.pkl", b"weights")
    holder = subprocess.Popen(
        [PYTHON, "-c", HOLDER, str(held), mode], cwd=tmp_path, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        start = start_time(holder.pid)
        if mode == "rb":
            detail, _ = launch.fn(t, 1)
            assert detail.pid and collect_snapshot(t).pid_alive, "a reader of checkpoint_dir kept the run from launching"
        else:
            error = refused(t, 19)
            assert f"PID {holder.pid}: {PYTHON} -c" in str(error) and t.checkpoint_dir in str(error)
            nothing_launched(t, set())
        keeps_stepping(holder, start)
    finally:
        kill_group(holder)
        subprocess.run(["tmux", "kill-session", "-t", f"={t.tmux_session}"], capture_output=True)


# A trainer that sets its own process title (setproctitle): `exec -a` gives it another argv[0], and it writes its
# command name in /proc/self/comm and its log in log_dir. sys.argv[1]: the log.
RENAMED = (
    "import pathlib, sys, time\n"
    "pathlib.Path('/proc/self/comm').write_text('trainer-rank0')\n"
    "log = open(sys.argv[1], 'a')\n"
    "print('renamed', flush=True)\n"
    "while True:\n"
    "    print('step=1 loss=2.0', file=log, flush=True)\n"
    "    time.sleep(0.2)\n"
)


@pytest.mark.parametrize("where", ["repo_dir", "elsewhere"])
def test_a_renamed_python_trainer_writing_the_log_dir_from_repo_dir_is_found_and_blocks_a_second_one(made, tmp_path, where):
    """Its name says nothing (argv and comm are its own title): a Python working in repo_dir that writes under log_dir is
    this target's trainer by what it is and does, refused by exit 21 and named as a stray; the same process working
    elsewhere is none of this target's, and the launch goes on."""
    t = made()
    Path(t.log_dir).mkdir(parents=True, exist_ok=True)
    log = Path(t.log_dir) / "by_hand.log"
    cwd = t.repo_dir if where == "repo_dir" else str(tmp_path)
    renamed = subprocess.Popen(
        ["bash", "-c", 'exec -a "trainer: rank 0" "$0" -c "$1" "$2"', PYTHON, RENAMED, str(log)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert renamed.stdout.readline().strip() == "renamed"
        assert Path(f"/proc/{renamed.pid}/comm").read_text().strip() == "trainer-rank0"
        start = start_time(renamed.pid)
        if where == "repo_dir":
            strays = collect_snapshot(t).strays
            assert [line for line in strays if line.startswith(f"{renamed.pid} ")], f"the renamed trainer is no stray: {strays}"
            error = refused(t, 21)
            assert f"PID {renamed.pid}: trainer: rank 0" in str(error)
            nothing_launched(t, set())
        else:
            detail, _ = launch.fn(t, 1)
            assert detail.pid and collect_snapshot(t).pid_alive
        keeps_stepping(renamed, start)
    finally:
        kill_group(renamed)
        subprocess.run(["tmux", "kill-session", "-t", f"={t.tmux_session}"], capture_output=True)


def test_another_targets_trainer_running_the_same_program_in_a_shared_repo_is_not_this_targets(made):
    """Two targets, one repo, one program: the first's trainer (its marker says whose; it writes its own checkpoint_dir
    and log_dir) is no stray of the second, and no reason never to launch it. Both train; the first is untouched."""
    a = made()
    b = made(repo_dir=a.repo_dir)
    record, _ = launch.fn(a, 1)
    start = start_time(record.pid)
    try:
        assert not [line for line in collect_snapshot(b).strays if line.startswith(f"{record.pid} ")], (
            "the other target's trainer is a stray"
        )
        detail, _ = launch.fn(b, 1)
        assert detail.pid != record.pid and collect_snapshot(b).pid_alive and collect_snapshot(a).pid_alive
        assert start_time(record.pid) == start, "the first target's trainer was touched"
    finally:
        for t in (a, b):
            subprocess.run(["tmux", "kill-session", "-t", f"={t.tmux_session}"], capture_output=True)


def test_a_second_target_on_the_same_state_folder_is_refused_and_the_first_trains_on(made):
    a = made()
    b = made(state_dir=a.state_path)
    record, _ = launch.fn(a, 1)
    start, run = start_time(record.pid), run_record(a)
    assert (Path(a.state_path) / "target").read_text().strip() == state_identity(a)
    error = refused(b, 20)
    assert state_identity(a) in str(error), "the refusal does not name the target owning the state folder"
    assert start_time(record.pid) == start and run_record(a) == run and tmux_alive(a.tmux_session)
    assert not tmux_alive(b.tmux_session)


def test_launch_refuses_an_existing_tmux_session_and_leaves_its_program_running(made):
    t = made()
    subprocess.run(["tmux", "new-session", "-d", "-s", t.tmux_session, "-c", t.repo_dir, "bash stepper.sh"], check=True)
    try:
        pane = int(subprocess.check_output(["tmux", "list-panes", "-s", "-t", f"={t.tmux_session}", "-F", "#{pane_pid}"], text=True))
        start = start_time(pane)
        error = refused(t, 11)
        assert f"tmux session {t.tmux_session} exists" in str(error)
        assert f"what to do: a tmux session of this name exists: look at it (`tmux attach -t ={t.tmux_session}`)" in str(error)
        assert start_time(pane) == start and tmux_alive(t.tmux_session), "the session's program was touched"
        assert not (Path(t.state_path) / "current").exists(), "a refused launch recorded a run"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", f"={t.tmux_session}"], capture_output=True)


def test_a_session_holding_only_a_persons_idle_shell_gets_the_run_in_a_new_window_and_the_shell_is_left_alone(made):
    """The person's shell kept the session alive after their trainer crashed: no trainer, no reason to stay dead."""
    t = made()
    subprocess.run(["tmux", "new-session", "-d", "-s", t.tmux_session, "-c", t.repo_dir], check=True)  # the default shell
    try:
        shell = int(subprocess.check_output(["tmux", "list-panes", "-s", "-t", f"={t.tmux_session}", "-F", "#{pane_pid}"], text=True))
        idle = Path(f"/proc/{shell}/task/{shell}/children")
        wait_for(lambda: Path(f"/proc/{shell}/comm").read_text().strip() == "bash" and not idle.read_text().split(), 20, "an idle shell")
        start = start_time(shell)
        detail, _ = launch.fn(t, 1)
        snap = collect_snapshot(t)
        assert detail.pid and snap.pid_alive and not snap.foreign, "the run started in the session and is relaunch's own"
        pane, _ = recorded(run_record(t) / "pane")
        assert pane != shell and pane in {
            int(p)
            for p in subprocess.check_output(
                ["tmux", "list-panes", "-s", "-t", f"={t.tmux_session}", "-F", "#{pane_pid}"], text=True
            ).split()
        }
        assert start_time(shell) == start, "the person's shell was touched"
        stop.fn(t)
        assert start_time(shell) == start and tmux_alive(t.tmux_session), "a stop closed more than the run's own pane"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", f"={t.tmux_session}"], capture_output=True)


@pytest.mark.parametrize(
    ("folder", "marker", "code"), [("venv_dir", ".relaunch-building", 15), ("inductor_cache_dir", ".relaunch-warming", 16)]
)
def test_launch_refuses_a_half_built_venv_or_cache_and_starts_nothing(made, folder, marker, code):
    t = made()
    launch.fn(t, 1)  # an earlier run, stopped: the refusal must leave its records as they are
    first = run_record(t)
    stop.fn(t)
    Path(getattr(t, folder)).mkdir(parents=True, exist_ok=True)
    (Path(getattr(t, folder)) / marker).touch()
    error = refused(t, code)
    assert marker in str(error)
    assert run_record(t) == first, "a refused launch moved the current run"
    nothing_launched(t, {first.name})


def test_launch_records_its_pane_claims_the_state_folder_and_ends_a_deliberate_stop(made):
    t = made()
    Path(t.state_path).mkdir(parents=True)
    (Path(t.state_path) / "stopped").write_text("1700000000\n")
    launch.fn(t, 1)
    run = run_record(t)
    pane_pid, pane_id = subprocess.check_output(
        ["tmux", "list-panes", "-s", "-t", f"={t.tmux_session}", "-F", "#{pane_pid} #{pane_id}"], text=True
    ).split()
    assert recorded(run / "pane") == (int(pane_pid), start_time(int(pane_pid)))
    assert (run / "pane_id").read_text().strip() == pane_id
    assert not (Path(t.state_path) / "stopped").exists(), "a launch left the deliberate stop in place"
    assert (Path(t.state_path) / "target").read_text().strip() == state_identity(t)


def _last_runs_lingering_pane(t) -> tuple[int, str]:
    """The session as a dead run leaves it for a moment: its own recorded pane still open, its trainer gone."""
    subprocess.run(["tmux", "new-session", "-d", "-s", t.tmux_session, "sleep infinity"], check=True)
    pane_pid, pane_id = subprocess.check_output(
        ["tmux", "list-panes", "-s", "-t", f"={t.tmux_session}", "-F", "#{pane_pid} #{pane_id}"], text=True
    ).split()
    run = Path(t.state_path) / "runs" / "r0"
    run.mkdir(parents=True)
    (run / "pane").write_text(f"{pane_pid} {start_time(int(pane_pid))}\n")
    (run / "pane_id").write_text(pane_id + "\n")
    (run / "pid").write_text("999999 1\n")  # long gone
    (Path(t.state_path) / "current").write_text("r0\n")
    return int(pane_pid), pane_id


def test_the_last_runs_own_pane_left_behind_by_a_dead_trainer_is_closed_and_the_launch_goes_on(made):
    t = made()
    pane, _ = _last_runs_lingering_pane(t)
    detail, _ = launch.fn(t, 1)
    assert detail.pid and start_time(pane) is None, "the last run's own pane was closed, and the new run started"
    assert collect_snapshot(t).pid_alive


def test_a_session_holding_another_pane_beside_the_last_runs_is_still_refused(made):
    t = made()
    pane, _ = _last_runs_lingering_pane(t)
    other = int(
        subprocess.check_output(
            ["tmux", "new-window", "-d", "-P", "-F", "#{pane_pid}", "-t", f"={t.tmux_session}:", "sleep infinity"], text=True
        )
    )
    try:
        refused(t, 11)
        assert start_time(pane) and start_time(other), "a session with a pane that is not relaunch's is left whole"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", f"={t.tmux_session}"], capture_output=True)
