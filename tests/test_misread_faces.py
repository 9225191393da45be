"""Issue 48: four failures that were misread, each read by its mechanism. Every face is a real capture in
tests/fixtures/logs/cpu (bench/cpu_capture/capture_issue48.sh; PROVENANCE.md there); Hypothesis varies the shapes
around them (ranks, numbers, names, prefixes, what comes before and after) over those same captured lines.

1. A wrapper's exit 0 over an uncaught exception (`python train.py | tee log` without pipefail, a script's last line):
   the log ends in a traceback after its last step and never says it finished; Python exits 1 on one, so the 0 is the
   wrapper's. A crash, with the log's own cause, and the evidence says whose 0 it was.
2. A checkpoint whose pickled class a refactor moved or renamed: torch.load's unpickler names a module or class the
   code no longer has. checkpoint_incompatible (restore the code, or escalate), never broken_checkpoint (skip it).
3. numpy's short write (`OSError: N requested and M written`) is a full disk; the poll's free space confirms it.
4. A monitored barrier that timed out is a distributed failure whose cause is the ranks that never arrived, named.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relaunch.config import Target, Thresholds
from relaunch.deciding.checkpoints import Entry, choose
from relaunch.deciding.playbook import choose_action, remedy, resume_constraints, steps_for
from relaunch.judging.diagnosis import diagnose
from relaunch.judging.findings import Diagnosis
from relaunch.judging.logtext import clean_lines
from relaunch.judging.snapshot import DiskFree, HealthSnapshot
from relaunch.judging.wrappers import uncaught_at_end
from relaunch.tasks.health import check_health
from relaunch.tasks.launch import launch
from relaunch.testing.faults import making
from relaunch.testing.targets import wait_for_exit
from relaunch.vocabulary import Action, Cause, Step, Verdict

CPU = Path(__file__).parent / "fixtures" / "logs" / "cpu"
T = Thresholds()
WRAPPER_SAID = "exit code 0 recorded, but it is a wrapper's, not the trainer's"


def lines_of(fixture: str) -> list[str]:
    return clean_lines((CPU / fixture).read_text())


def died(lines: list[str], exit_code: int | None = 1, **facts: object) -> Diagnosis:
    return diagnose(HealthSnapshot(launched=True, exit_code=exit_code, log_tail=lines, **facts), T)


def traceback_of(fixture: str) -> list[str]:
    """The captured log's last traceback, from its header to the end of the log."""
    lines = lines_of(fixture)
    start = max(i for i, line in enumerate(lines) if line.endswith("Traceback (most recent call last):"))
    return lines[start:]


# ---- 1. a wrapper's exit 0 over an uncaught exception -------------------------------------------------------------

WRAPPED_ZERO = ["tee_traceback.log", "wrapped_tee_traceback.log", "wrapped_traceback_echo.log", "torchrun_tee_traceback.log"]
MISSING_SHARD = re.compile(r"^FileNotFoundError: \[Errno 2\] No such file or directory: '.*/shard_00003\.bin'$")


@pytest.mark.parametrize("fixture", WRAPPED_ZERO)
def test_an_exit_0_over_an_uncaught_exception_at_the_logs_end_is_a_crash_and_the_0_is_named_the_wrappers(fixture: str) -> None:
    d = died(lines_of(fixture), exit_code=0)
    assert (d.verdict, d.cause) == (Verdict.CRASHED, Cause.ERROR), d.summary
    assert MISSING_SHARD.match(d.summary.removeprefix("error: ")), d.summary
    assert any(line.startswith(WRAPPER_SAID) for line in d.evidence), d.evidence
    assert "no exit code recorded" not in d.evidence, "the 0 was recorded: it is named as the wrapper's instead"
    assert remedy(d).action is Action.FULL_RECOVERY, "recovered as the error it is, never left as a success"


def test_the_same_pipe_adopted_from_a_pane_has_no_exit_code_and_reads_its_traceback_as_before() -> None:
    # A run typed into tmux as `python train.py | tee log` is adopted with no exit code to read (no supervisor).
    d = died(lines_of("tee_traceback.log"), exit_code=None, adopted=True)
    assert (d.verdict, d.cause) == (Verdict.CRASHED, Cause.ERROR), d.summary
    assert any("an adopted run's exit code cannot be known" in line for line in d.evidence), d.evidence


# Tracebacks of other real deaths (exit 1 when captured), each ending its log: with a wrapper's 0 over them they read
# as what they are, not finished.
OTHER_DEATHS = {
    "generic_error.log": Cause.ERROR,
    "missing_dependency_dotted.log": Cause.MISSING_DEPENDENCY,
    "python_memoryerror.log": Cause.ERROR,
    "disk_full_log_write.log": Cause.DISK_FULL,
    "numpy_short_write.log": Cause.DISK_FULL,
    "checkpoint_class_moved.log": Cause.CHECKPOINT_INCOMPATIBLE,
    "compile_error_invalid_cxx.log": Cause.COMPILE_ERROR,
}
# What a wrapper prints after its trainer (its own echo, tee's last flush, the interpreter's shutdown warnings).
AFTER_WRAPPER = st.lists(
    st.sampled_from(
        [
            "start.sh: training script ended",
            "",
            "done",
            "syncing logs to s3://bucket/run-7",
            "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There appear to be 1 leaked semaphore objects to clean up at shutdown",
        ]
    ),
    max_size=4,
).filter(lambda after: sum(1 for line in after if line and "Warning" not in line) <= 3)


@settings(max_examples=60)
@given(
    death=st.sampled_from(sorted(OTHER_DEATHS)),
    steps=st.integers(0, 9),
    rank=st.none() | st.integers(0, 63),
    before=st.sampled_from(["", "saving eval features to /ckpt/features.npy", "resuming from /ckpt/step_800/model.pt"]),
    after=AFTER_WRAPPER,
)
def test_any_real_traceback_ending_the_log_under_a_wrappers_0_reads_as_its_own_cause(
    death: str, steps: int, rank: int | None, before: str, after: list[str]
) -> None:
    """The step lines of the captured tee run, then another capture's traceback (torch's `[rankN]: ` prefix on it or
    not), then what a wrapper prints after: read as that traceback's cause, the 0 named as a wrapper's."""
    prefix = f"[rank{rank}]: " if rank is not None else ""
    # A checkpoint load that fails after steps is about something else (the checkpoint it was given loaded).
    steps = 0 if OTHER_DEATHS[death] is Cause.CHECKPOINT_INCOMPATIBLE else steps
    steps_before = [line for line in lines_of("tee_traceback.log") if line.startswith("step=")][:steps]
    log = [*steps_before, *([before] if before else []), *[prefix + line for line in traceback_of(death)], *after]
    d = died(log, exit_code=0)
    assert (d.verdict, d.cause) == (Verdict.CRASHED, OTHER_DEATHS[death]), (death, d.summary)
    assert any(line.startswith(WRAPPER_SAID) for line in d.evidence), d.evidence


# What a healthy end prints after a traceback the trainer logged and went past (captured step lines, a finish word).
CARRIED_ON = st.sampled_from(["steps", "training complete", "Training completed. Do not forget to share your model", "lines"])


@settings(max_examples=40)
@given(traceback=st.sampled_from(sorted(OTHER_DEATHS)), then=CARRIED_ON, steps=st.integers(1, 5))
def test_a_traceback_the_trainer_went_past_or_followed_by_its_finish_leaves_an_exit_0_finished(
    traceback: str, then: str, steps: int
) -> None:
    """A logged exception the run carried on from (step lines after it), one followed by the trainer's word that it
    finished, or by more lines than a wrapper prints (the trainer went on writing): the 0 is the trainer's own."""
    step_lines = [line for line in lines_of("tee_traceback.log") if line.startswith("step=")]
    later = {
        "steps": step_lines[-steps:],
        "lines": [f"saved eval samples {i} to /ckpt/eval_{i}.jsonl" for i in range(3 + steps)],
    }.get(then, [then])
    log = [*step_lines[: 9 - steps], *traceback_of(traceback), *later]
    assert died(log, exit_code=0).verdict is Verdict.FINISHED, (traceback, then)


def test_reports_of_exceptions_that_ended_nothing_leave_an_exit_0_finished() -> None:
    # Python's `Exception ignored in` report at shutdown (a __del__'s, captured on the H200) and glog W-line tracebacks
    # of damaged cache entries torch recompiled past: neither is an uncaught exception.
    ignored = clean_lines((CPU.parent / "gpu" / "cache_fxgraph_half.log").read_text())
    start = next(i for i, line in enumerate(ignored) if line.startswith("Exception ignored in"))
    steps = [line for line in lines_of("tee_traceback.log") if line.startswith("step=")]
    log = [*steps, *ignored[start : start + 12]]
    assert uncaught_at_end(log) is None, log
    assert died(log, exit_code=0).verdict is Verdict.FINISHED
    assert died(lines_of("compile_cache_entries_truncated.log"), exit_code=0).verdict is Verdict.FINISHED


# ---- 2. a checkpoint the code refuses is not a broken checkpoint --------------------------------------------------

CHECKPOINTS = [Entry(name=f"step_{n}.pt", kind="f", mtime=1000.0 + n) for n in (700, 800)]


def resumed_from(d: Diagnosis) -> str:
    before_step, refuse = resume_constraints(d)
    return choose([e for e in CHECKPOINTS if e.name != refuse], before_step=before_step).name


@pytest.mark.parametrize(
    ("fixture", "named"),
    [("checkpoint_class_moved.log", "`trainlib.config`"), ("checkpoint_class_renamed.log", "`TrainConfig` in `trainlib.config`")],
)
def test_a_pickled_class_a_refactor_moved_is_an_incompatible_checkpoint_restored_by_code_never_skipped(fixture: str, named: str) -> None:
    d = died(lines_of(fixture), checkpoint="/ckpt/step_800.pt")
    assert (d.verdict, d.cause) == (Verdict.CRASHED, Cause.CHECKPOINT_INCOMPATIBLE), d.summary
    assert any(named in line and "the checkpoint is intact" in line for line in d.evidence), d.evidence
    assert steps_for(remedy(d).action) == [Step.BUILD_VENV, Step.STOP, Step.REBUILD_VENV, Step.RESTORE_CODE, Step.LAUNCH]
    assert resumed_from(d) == "step_800.pt", "never skip a checkpoint the code refuses"
    action, why = choose_action(d, [d], 3)
    assert action is Action.ESCALATE and "trainlib.config" in why, why


def test_the_same_file_loads_with_the_code_that_wrote_it_and_real_damage_is_still_broken() -> None:
    assert died(lines_of("checkpoint_class_restored.log"), exit_code=0).verdict is Verdict.FINISHED
    d = died(lines_of("truncated_checkpoint_load.log"), checkpoint="/ckpt/step_800.pt")
    assert d.cause is Cause.BROKEN_CHECKPOINT and resumed_from(d) == "step_700.pt"


DOTTED = st.from_regex(r"[a-z][a-z0-9_]{0,11}(\.[a-z][a-z0-9_]{0,11}){0,3}", fullmatch=True)
CLASS = st.from_regex(r"[A-Z][A-Za-z0-9_]{0,15}", fullmatch=True)


@settings(max_examples=60)
@given(
    module=DOTTED,
    cls=CLASS,
    which=st.sampled_from(["checkpoint_class_moved.log", "checkpoint_class_renamed.log"]),
    rank=st.none() | st.integers(0, 7),
)
def test_any_module_or_class_the_unpickler_cannot_find_is_incompatible_on_any_rank(
    module: str, cls: str, which: str, rank: int | None
) -> None:
    """The captured load's lines, the module and class renamed (and torch's `[rankN]: ` on them): the code moved it."""
    prefix = f"[rank{rank}]: " if rank is not None else ""
    log = [prefix + line.replace("trainlib.config", module).replace("TrainConfig", cls) for line in lines_of(which)]
    d = died(log)
    assert d.cause is Cause.CHECKPOINT_INCOMPATIBLE, d.summary
    assert any(f"`{module}`" in line for line in d.evidence), d.evidence


# ---- 3. numpy's short write is a full disk ---------------------------------------------------------------------------


def df_disk() -> DiskFree:
    """The 64 KiB tmpfs as `df -B1` read it after the short write (cpu/numpy_short_write.df)."""
    path, size, avail = (CPU / "numpy_short_write.df").read_text().splitlines()[1].split()
    return DiskFree(path=path, size_bytes=int(size), available_bytes=int(avail))


def test_numpys_short_write_is_a_full_disk_and_the_polls_free_space_confirms_it() -> None:
    saved = died(lines_of("numpy_short_write.log"))
    assert (saved.cause, saved.disk_still_full) == (Cause.DISK_FULL, False), saved.summary
    assert any("a short write: 8176 of 100000 items written" in line for line in saved.evidence), saved.evidence
    full = died(lines_of("numpy_short_write.log"), disks=[df_disk()])
    assert (full.cause, full.disk_still_full) == (Cause.DISK_FULL, True), full.summary
    assert full.summary.startswith(f"only 0.0 MB free of 0.1 MB at {df_disk().path}: the disk is full"), full.summary
    assert remedy(full).action is not Action.RELAUNCH_EARLIER, "never relaunched onto the disk that is still full"


def test_a_short_write_on_a_disk_with_room_again_says_so_and_relaunches_from_before_the_write() -> None:
    roomy = DiskFree(path="/ckpt", size_bytes=500 * 10**9, available_bytes=200 * 10**9)
    d = died(lines_of("numpy_short_write.log"), disks=[roomy])
    assert (d.cause, d.disk_still_full) == (Cause.DISK_FULL, False), d.summary
    assert any(line.startswith("free space now: 200.00 GB free of 500.00 GB at /ckpt: none full") for line in d.evidence), d.evidence
    assert remedy(d).action is Action.RELAUNCH_EARLIER


@settings(max_examples=60)
@given(requested=st.integers(2, 10**12), share=st.floats(0, 0.999), rank=st.none() | st.integers(0, 63), steps=st.integers(0, 6))
def test_a_short_write_of_any_size_on_any_rank_is_a_full_disk(requested: int, share: float, rank: int | None, steps: int) -> None:
    written = int(requested * share)
    prefix = f"[rank{rank}]: " if rank is not None else ""
    lines = lines_of("numpy_short_write.log")  # 6 step lines, then the save that failed
    log = [
        prefix + line.replace("100000 requested and 8176 written", f"{requested} requested and {written} written")
        for line in lines[6 - steps :]
    ]
    d = died(log)
    assert d.cause is Cause.DISK_FULL, d.summary
    assert any(f"a short write: {written} of {requested} items written" in line for line in d.evidence), d.evidence


# ---- 4. a monitored barrier that timed out: the ranks that never arrived ----------------------------------------

BARRIERS = {
    "monitored_barrier_timeout.log": "rank 1 never reached the monitored barrier: rank 0 waited 30000 ms for it",
    "monitored_barrier_torchrun.log": "rank 1 never reached the monitored barrier: rank 0 waited 30000 ms for it",
    "monitored_barrier_all_ranks_torchrun.log": "ranks 1, 2 never reached the monitored barrier: rank 0 waited 30000 ms for them",
}


@pytest.mark.parametrize("fixture", sorted(BARRIERS))
def test_a_monitored_barrier_that_timed_out_is_a_distributed_failure_naming_the_ranks_that_never_arrived(fixture: str) -> None:
    d = died(lines_of(fixture))
    assert (d.verdict, d.cause, d.rendezvous_incomplete) == (Verdict.CRASHED, Cause.DISTRIBUTED_FAILURE, False), d.summary
    assert d.summary.startswith(BARRIERS[fixture]), d.summary
    assert remedy(d).action is Action.RELAUNCH, "every rank stopped and relaunched together"
    # The late rank's own log (it arrived after rank 0 gave up) only lost its peer: distributed too.
    assert died(lines_of("monitored_barrier_timeout_rank1.log")).cause is Cause.DISTRIBUTED_FAILURE


@settings(max_examples=60)
@given(
    late=st.lists(st.integers(1, 127), min_size=1, max_size=4, unique=True),
    ms=st.integers(1, 3_600_000),
    fixture=st.sampled_from(sorted(BARRIERS)),
)
def test_the_ranks_named_are_those_that_never_arrived_whatever_their_numbers_and_the_timeout(
    late: list[int], ms: int, fixture: str
) -> None:
    """The captured report, its late ranks and timeout renumbered (one rank: `Rank N`; several: `Ranks N, M`)."""
    said = f"Rank {late[0]}" if len(late) == 1 else f"Ranks {', '.join(map(str, late))}"
    report = re.compile(r"Ranks? \d+(?:, \d+)* failed to pass monitoredBarrier in \d+ ms")
    timed = re.compile(r"Timed out waiting \d+ms")
    log = [
        timed.sub(f"Timed out waiting {ms}ms", report.sub(f"{said} failed to pass monitoredBarrier in {ms} ms", line))
        for line in lines_of(fixture)
    ]
    d = died(log)
    who = f"rank {late[0]}" if len(late) == 1 else f"ranks {', '.join(map(str, late))}"
    assert d.cause is Cause.DISTRIBUTED_FAILURE, d.summary
    assert d.summary.startswith(f"{who} never reached the monitored barrier: rank 0 waited {ms} ms"), d.summary


@settings(max_examples=30)
@given(bad=st.integers(1, 63), first=st.booleans())
def test_a_rank_that_failed_by_itself_before_the_barrier_is_the_cause_not_the_barrier_it_missed(bad: int, first: bool) -> None:
    """rank_error_torchrun.log's rank 1 IndexError (renumbered) beside rank 0's barrier timeout naming that rank: the
    rank's own error is the cause, the barrier its knock-on (issue 35's rule)."""
    own = [f"[rank{bad}]:{line[len('[rank1]:') :]}" for line in lines_of("rank_error_torchrun.log") if line.startswith("[rank1]:")]
    barrier = [
        line.replace("Rank 1 failed", f"Rank {bad} failed")
        for line in lines_of("monitored_barrier_timeout.log")
        if line.startswith("[rank0]:")
    ]
    d = died([*own, *barrier] if first else [*barrier, *own])
    assert d.cause is Cause.ERROR and d.summary == f"error: [rank{bad}]: IndexError: index out of range in self", d.summary


# ---- 1, on a real launch: relaunch's supervisor runs a wrapper script whose trainer raises -----------------------------

BENCH = Path(__file__).parent.parent / "bench" / "cpu_capture"


@pytest.fixture
def made(tmp_path: Path) -> Iterator[Callable[..., Target]]:
    with making(tmp_path) as make:
        yield make


@pytest.mark.parametrize(
    ("script", "said"),
    [
        # The script's last line is its own: its 0 comes with no pipe for the supervisor to see.
        ('{py} -u shard_trainer.py {data}\necho "start.sh: training script ended"\n', WRAPPER_SAID),
        # The trainer piped into tee inside the script: the supervisor sees the pipe and says so itself.
        ("{py} -u shard_trainer.py {data} 2>&1 | tee -a train.log\n", "the launch command exited 0, but the trainer PID"),
    ],
    ids=["script-echo", "script-tee"],
)
def test_a_launched_wrapper_script_whose_trainer_raised_exits_0_and_is_read_as_the_trainers_error(
    made: Callable[..., Target], tmp_path: Path, script: str, said: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in (0, 1, 2):  # shard_00003.bin, which the trainer reads next, is not there
        (data / f"shard_{i:05d}.bin").write_bytes(bytes(16384))
    target = made(launch_command="bash start.sh")
    repo = Path(target.repo_dir)
    for name in ("shard_trainer.py", "_steps.py"):
        shutil.copy(BENCH / name, repo / name)
    (repo / "start.sh").write_text(script.format(py=shlex.quote(sys.executable), data=shlex.quote(str(data))))
    launch.fn(target, 1)
    wait_for_exit(target, timeout_seconds=180)
    result = check_health.fn(target)
    assert result.snapshot.exit_code == 0, "the wrapper script itself exits 0"
    d = result.diagnosis
    assert (d.verdict, d.cause) == (Verdict.CRASHED, Cause.ERROR), d
    assert "FileNotFoundError" in d.summary and "shard_00003.bin" in d.summary, d.summary
    assert any(line.startswith(said) for line in d.evidence), d.evidence


@pytest.mark.parametrize("fixture", ["background_thread_traceback.log", "background_process_traceback.log"])
def test_a_traceback_of_a_thread_or_child_process_at_a_runs_end_is_no_uncaught_exception_of_the_trainer(fixture: str) -> None:
    # Captured exits 0: an uploader thread's (`Exception in thread uploader:`) and an exporter process's (`Process
    # exporter:`) tracebacks after the last step; the trainer's own process ended as it should.
    assert uncaught_at_end(lines_of(fixture)) is None
    assert died(lines_of(fixture), exit_code=0).verdict is Verdict.FINISHED
