"""Only this run's text is judged: an appended log's earlier runs, and a wrapper script's exit 0, are not this run's end.

Issue 36. A log written with `tee -a` or `>>` (or one file a target points many runs at) holds last week's failures
before this run's first byte: a SIGKILL read as last week's `ModuleNotFoundError` installs a package and leaves the
run dead. RUN/log_offset records where this run's text begins (the log's size before the supervisor's first write,
or at adoption), and every failure reading of the poll (its failure scan, its tail) starts there. A launch command
that is a wrapper script (`bash start.sh` running `python train.py | tee -a log`) exits with tee's 0 whatever killed
its trainer: that 0 is not `finished`.

The processes are real (tmux, bash, python, SIGKILL); the offsets and rotations are drawn by Hypothesis and read by the
real poll (relaunch/host/snapshot.sh) on real files.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relaunch.host import host_script
from relaunch.judging.logtext import FAILURE_WORDS
from relaunch.plans.health import parse_snapshot
from relaunch.runlayout import log_path, new_nonce
from relaunch.tasks.adopt import adopt_run
from relaunch.tasks.health import check_health, collect_snapshot
from relaunch.tasks.launch import launch
from relaunch.testing.faults import making
from relaunch.testing.targets import current, wait_for_exit
from relaunch.vocabulary import Cause, Verdict
from tests.handmade import Proc, kill, reap, start_by_hand, trainers, wait_for

LAST_WEEK = (
    "step=4990 loss=2.1 acc=0.5 lr=1e-4 | dft=0.50b/s (20.0Ktok/s) | q_hs=[2]\n"
    "Traceback (most recent call last):\n"
    '  File "train.py", line 3, in <module>\n'
    "    import flash_attn\n"
    "ModuleNotFoundError: No module named 'flash_attn'\n"
)
# A trainer in Python: step lines every 0.1 s; with STEPS=N it says so after N steps and exits 0; with HOLD=PATH it
# waits after step 3 until PATH exists.
TRAIN_PY = """import os, sys, time
n, hold = int(os.environ.get("STEPS", "0")), os.environ.get("HOLD")
for i in range(1, 100000):
    print(f"step={i} loss=3.6441 acc=0.097 lr=3.96e-04 | dft=0.50b/s (20.0Ktok/s) | q_hs=[2]", flush=True)
    while hold and i >= 3 and not os.path.exists(hold):
        time.sleep(0.05)
    if n and i >= n:
        print("training complete", flush=True)
        sys.exit(0)
    time.sleep(0.1)
"""


@pytest.fixture
def made(tmp_path):
    with making(tmp_path) as make:
        yield make


def run_folder(target) -> Path:
    return Path(target.state_path) / "runs" / current(target)


def cksum(data: bytes) -> str:
    """POSIX cksum's CRC of DATA (what the host scripts sum the bytes before the offset with)."""
    return subprocess.run(["cksum"], input=data, capture_output=True, check=True).stdout.split()[0].decode()


def offset_record(before: bytes) -> str:
    """RUN/log_offset for a log that held BEFORE when the run began: its size and the sum of its last 64 bytes."""
    return f"{len(before)} {cksum(before[-64:]) if before else ''}".rstrip() if before else "0"


def with_python(target, **env: str):
    """The target's repo with train.py and a wrapper script, start.sh, piping it into `tee -a train.log`."""
    repo = Path(target.repo_dir)
    (repo / "train.py").write_text(TRAIN_PY)
    (repo / "start.sh").write_text(f"{shlex.quote(sys.executable)} train.py 2>&1 | tee -a train.log\n")
    return target.model_copy(update={"env": {**target.env, **env}})


def python_trainer(repo: str) -> Proc:
    return wait_for(lambda: (found := trainers(repo, "train.py")) and found[0], "the python trainer to start")


# ---- an appended log: last week's failure is not this run's ------------------------------------------------------


def test_a_launched_run_killed_by_sigkill_is_killed_not_last_weeks_missing_module_in_its_appended_log(made):
    target = made()
    run_id = f"20260101T000000.000000Z-a1-{uuid.uuid4().hex[:6]}"
    log = Path(log_path(target, run_id))
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(LAST_WEEK)  # the file this run's writer appends to already holds another run's death
    launch.fn(target, 1, run_id=run_id)
    run = run_folder(target)
    assert (run / "log_offset").read_text().strip() == offset_record(LAST_WEEK.encode())
    wait_for(lambda: "step=2 " in log.read_text(), "the run to step")
    pid, start = (int(x) for x in (run / "pid").read_text().split())
    kill([Proc(pid, start)])
    result = check_health.fn(target)
    d = result.diagnosis
    assert d.verdict is Verdict.CRASHED and d.cause is Cause.KILLED and d.package is None, d
    text = [*result.snapshot.log_matches, *result.snapshot.log_tail]
    assert not [line for line in text if "flash_attn" in line or "step=4990" in line], text


def test_an_adopted_tee_a_run_killed_by_sigkill_is_not_last_weeks_missing_module_before_the_adoption(made, tmp_path):
    target = with_python(made())
    log = Path(target.repo_dir) / "train.log"
    log.write_text(LAST_WEEK)
    session = target.tmux_session
    try:
        start_by_hand(session, f"{shlex.quote(sys.executable)} train.py 2>&1 | tee -a train.log", target.repo_dir)
        wait_for(lambda: "step=3 " in log.read_text(), "the run started by hand to step")
        first = check_health.fn(target)
        assert first.snapshot.adopted and first.diagnosis.verdict is Verdict.HEALTHY, first.diagnosis
        record = (run_folder(target) / "log_offset").read_text().split()
        assert LAST_WEEK.encode() in log.read_bytes()[: int(record[0])], "the offset lies past last week's text"
        kill([python_trainer(target.repo_dir)])
        result = check_health.fn(target)
    finally:
        reap([session], [tmp_path])
    d = result.diagnosis
    assert d.verdict is Verdict.CRASHED and d.cause is not Cause.MISSING_DEPENDENCY and d.package is None, d
    assert not [line for line in [*result.snapshot.log_matches, *result.snapshot.log_tail] if "flash_attn" in line]


def test_an_adopted_live_runs_step_lines_before_its_adoption_are_read_as_its_progress(made, tmp_path):
    target = with_python(made())
    log, hold = Path(target.repo_dir) / "train.log", tmp_path / "go-on"
    log.write_text(LAST_WEEK)
    try:
        start_by_hand(target.tmux_session, f"HOLD={hold} {shlex.quote(sys.executable)} train.py 2>&1 | tee -a train.log", target.repo_dir)
        wait_for(lambda: "step=3 " in log.read_text(), "the run started by hand to reach its pause")
        adopt_run(target)
        snap = collect_snapshot(target)
        assert snap.adopted and snap.pid_alive
        assert [line.split()[0] for line in snap.log_tail if "step=" in line][-3:] == ["step=1", "step=2", "step=3"], snap.log_tail
        assert not [line for line in snap.log_matches if "flash_attn" in line], "failures before the adoption are not scanned"
    finally:
        reap([target.tmux_session], [tmp_path])


# ---- a wrapper script's exit 0 is tee's, not the trainer's --------------------------------------------------------


def test_a_trainer_sigkilled_inside_a_wrapper_scripts_tee_pipeline_is_not_finished(made):
    target = with_python(made(launch_command="bash start.sh"))
    launch.fn(target, 1)
    run = run_folder(target)
    wait_for(lambda: (run / "pipeline").exists(), "the supervisor to see the trainer piped into tee")
    kill([python_trainer(target.repo_dir)])
    result = check_health.fn(target)
    d = result.diagnosis
    assert result.snapshot.exit_code == 0, "the wrapper itself exits 0: tee's status"
    assert d.verdict is Verdict.CRASHED and d.cause is Cause.SILENT_EXIT, d
    assert any("tee" in line for line in d.evidence), d.evidence


def test_a_trainer_that_says_training_is_complete_inside_a_wrapper_scripts_pipeline_is_finished(made):
    target = with_python(made(launch_command="bash start.sh"), STEPS="30")
    launch.fn(target, 1)
    wait_for_exit(target)
    result = check_health.fn(target)
    assert result.diagnosis.verdict is Verdict.FINISHED, result.diagnosis
    assert (run_folder(target) / "exit_masked").exists(), "the wrapper was seen: finished only by the trainer's word"


def test_a_trainer_sigkilled_in_the_launch_commands_own_pipeline_is_killed_by_sigkill(made):
    target = with_python(made(launch_command=f"{shlex.quote(sys.executable)} train.py 2>&1 | tee -a train.log"))
    launch.fn(target, 1)
    log = Path(target.repo_dir) / "train.log"
    wait_for(lambda: log.exists() and "step=2 " in log.read_text(), "the trainer to step")
    kill([python_trainer(target.repo_dir)])
    result = check_health.fn(target)
    assert result.snapshot.exit_code == 137, "pipefail: the pipeline's status is the trainer's"
    assert result.diagnosis.verdict is Verdict.CRASHED and result.diagnosis.cause is Cause.KILLED, result.diagnosis
    assert not (run_folder(target) / "exit_masked").exists()


# ---- the poll reads from the offset, whatever the log did since (Hypothesis, on the real poll) -------------------

OLD_LINE = st.sampled_from(["step={n} old", "RuntimeError: old {n}", "ModuleNotFoundError: No module named 'old{n}'", "old {n}"])
NEW_LINE = st.sampled_from(["step={n} new", "RuntimeError: new {n}", "new {n}", "Traceback (most recent call last): new {n}"])


def lines(kind, tag: str, max_size: int):
    return st.lists(kind, max_size=max_size).map(lambda ls: "".join(f"{s.format(n=i)} {tag}\n" for i, s in enumerate(ls)))


def poll(state: Path, tail_n: int, tail_bytes: int):
    nonce = new_nonce()
    args = [str(state), f"no-session-{uuid.uuid4().hex[:8]}", "0", str(tail_n), "0", nonce, str(state / "venv")]
    args += [str(state / "cache"), str(tail_bytes), FAILURE_WORDS, str(state), "", "0", "", "", "0", "", ""]
    out = subprocess.run(["bash", "-c", host_script("snapshot"), "snapshot", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return parse_snapshot(out.stdout, "local", nonce)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    old=lines(OLD_LINE, "OLD", 45),
    old_ends_mid_line=st.booleans(),
    early=lines(NEW_LINE, "NEW-early", 12),
    late=lines(NEW_LINE, "NEW-late", 12),
    rotated=st.none() | lines(NEW_LINE, "NEW-rotated", 40),
    summed=st.booleans(),
    tail_n=st.integers(1, 30),
    tail_bytes=st.integers(40, 4000),
)
def test_the_poll_judges_only_bytes_from_where_this_run_began_even_after_the_log_shrank_or_was_rewritten(
    old, old_ends_mid_line, early, late, rotated, summed, tail_n, tail_bytes
):
    before = (old + "old, cut off" if old_ends_mid_line else old).encode()
    state = Path(tempfile.mkdtemp(prefix="this-run-"))
    try:
        run = state / "runs" / "r1"
        run.mkdir(parents=True)
        log = state / "shared.log"
        log.write_bytes(before + early.encode())
        (state / "current").write_text("r1\n")
        (run / "log_path").write_text(f"{log}\n")
        # Unsummed: launch.sh's record before the supervisor's (a rewrite is then seen only as a log shorter than it).
        (run / "log_offset").write_text((offset_record(before) if summed else str(len(before))) + "\n")
        first = poll(state, tail_n, tail_bytes)
        with log.open("ab") as f:
            f.write(late.encode())
        this_run = early + late
        if rotated is not None:
            # copytruncate: the old bytes went elsewhere, what follows is the run's own
            log.write_bytes(b"")
            log.write_bytes(rotated.encode())
            this_run = rotated
        second = poll(state, tail_n, tail_bytes)
    finally:
        shutil.rmtree(state)
    for snap in (first, second):
        seen = [*snap.log_matches, *snap.log_tail]
        assert not [line for line in seen if "OLD" in line or "cut off" in line], seen
    if not summed and rotated is not None and len(rotated) >= len(before):
        return  # rewritten past the offset with no sum to tell: what lies before the offset is not read, rightly or not
    # Nothing of this run is lost: its last lines are the tail, its first failures are among the matches or the tail.
    mine = [line for line in this_run.splitlines() if line]
    tail = second.log_tail
    assert tail == mine[len(mine) - len(tail) :], (tail, mine)
    assert tail or not mine or len(mine[-1]) >= tail_bytes, "the last whole line within the byte budget is shown"
    failures = [line for line in mine if re.search(FAILURE_WORDS, line)][:30]
    assert set(failures) <= {*second.log_matches, *tail}, (failures, second.log_matches, tail)
