"""Judging a run by the rules relaunch applies to its own, on real captured output (tests/fixtures/judging/PROVENANCE.md).

Issue 25: healthy runs were misjudged and killed (a resume line ended the start-up grace, a checkpoint save was a
stall, a per-GPU figure read as the throughput, z_loss read as the loss, another job's kernel lines read as the
run's), and runs relaunch does not own must be reported, never touched.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from relaunch.config import Thresholds
from relaunch.judging.diagnosis import advance, diagnose
from relaunch.judging.findings import Progress
from relaunch.judging.hardware import parse_gpu_health
from relaunch.judging.logtext import clean_lines
from relaunch.judging.reading import read_log
from relaunch.judging.snapshot import HealthSnapshot
from relaunch.plans.health import parse_disks
from relaunch.vocabulary import Cause, Verdict

FIXTURES = Path(__file__).parent / "fixtures"
JUDGING = FIXTURES / "judging"
LOGS = FIXTURES / "logs"
T = Thresholds(startup_grace_seconds=900, stall_window_floor_seconds=300, healthy_steps=3)
LAUNCHED_AT = 1_764_650_000.0  # host epoch of the launch in the snapshots below


def lines(path: Path) -> list[str]:
    """The log as the health poll reads it: through clean_lines (tqdm's `\\r` redraws split into lines)."""
    return clean_lines(path.read_text(errors="replace"))


def alive(log: list[str], since_launch: float, since_write: float, **kw: object) -> HealthSnapshot:
    return HealthSnapshot(
        launched=True,
        session_alive=True,
        pid=4242,
        pid_alive=True,
        log_tail=log,
        seconds_since_launch=since_launch,
        seconds_since_log_write=since_write,
        log_mtime_epoch=LAUNCHED_AT + since_launch - since_write,
        **kw,
    )


def gone(log: list[str], exit_code: int | None, pid: int = 4242, **kw: object) -> HealthSnapshot:
    return HealthSnapshot(launched=True, session_alive=False, pid=pid, pid_alive=False, exit_code=exit_code, log_tail=log, **kw)


# ---- 1. the start-up grace ends at a training step, never at a resume or save line ---------------------------


def test_resume_and_checkpoint_load_lines_are_not_steps_so_a_run_compiling_after_its_resume_is_starting():
    resumed = lines(JUDGING / "resume_then_compile.log")
    # 400 s after launch, 350 s since its last line (past the 300 s window): it compiles after its resume.
    d = diagnose(alive(resumed, 400, 350), T)
    assert (d.metrics.steps_seen, d.metrics.last_step) == (0, None)
    assert d.verdict is Verdict.STARTING, d


def test_a_save_line_between_step_lines_is_not_a_step():
    reading = read_log(lines(JUDGING / "stepping_with_saves.log"), T)
    assert reading.steps == list(range(196, 205))


def test_a_step_pattern_the_user_gave_is_honoured_but_resume_and_save_lines_are_still_not_steps():
    at_step = T.model_copy(update={"step_pattern": r"at step (?P<step>\d+)"})
    assert read_log(lines(JUDGING / "resume_then_compile.log") + lines(JUDGING / "stepping_with_saves.log"), at_step).steps == []
    megatron = T.model_copy(update={"step_pattern": r"iteration\s+(?P<step>\d+)/"})
    assert read_log(lines(JUDGING / "losses.log"), megatron).steps == [10, 20, 30]


# ---- 2. tqdm progress counts as steps under the default pattern ----------------------------------------------


def test_a_tqdm_bar_counts_as_steps_and_start_up_bars_do_not():
    log = lines(JUDGING / "tqdm_bars.log")
    training = next(i for i, line in enumerate(log) if line.lstrip().startswith("0%|"))
    assert read_log(log[:training], T).steps == [], "the shard-loading and map bars are start-up, not training"
    reading = read_log(log, T)
    assert reading.steps == list(range(1, 121)), "one step per count: the closing redraw of 120 is no new step"
    d = diagnose(alive(log, 600, 1), T)
    assert (d.verdict, d.metrics.last_step) == (Verdict.HEALTHY, 120)


def test_a_tqdm_count_of_unknown_total_counts_as_steps():
    assert read_log(lines(JUDGING / "tqdm_no_total.log"), T).steps == list(range(1, 31))


def test_a_tqdm_bar_is_no_step_under_a_step_pattern_the_user_gave():
    custom = T.model_copy(update={"step_pattern": r"\bstep=(?P<step>\d+)"})
    assert read_log(lines(JUDGING / "tqdm_bars.log"), custom).steps == []


# ---- 3. totals win over per-GPU figures ----------------------------------------------------------------------


def test_the_whole_jobs_throughput_wins_over_a_per_gpu_figure_on_the_same_line():
    log = lines(JUDGING / "throughput.log")
    assert read_log(log, T).throughputs == [21300.0] * 4 + [21288.0, 21270.0]
    d = diagnose(alive(log, 600, 1), T.model_copy(update={"baseline_tokens_per_second": 21500}))
    assert d.verdict is Verdict.HEALTHY, d
    assert d.metrics.tokens_per_second == 21288.0


# ---- 4. `loss` means the loss --------------------------------------------------------------------------------


def test_z_loss_and_aux_loss_of_nan_beside_a_finite_loss_is_no_divergence():
    log = lines(JUDGING / "losses.log")[:4]
    assert read_log(log, T).losses == [2.61, 2.62, 2.63, 2.64]
    d = diagnose(alive(log, 600, 1), T)
    assert (d.verdict, d.metrics.first_nonfinite_step) == (Verdict.HEALTHY, None)


def test_megatrons_lm_loss_is_the_loss_and_its_moe_losses_are_not():
    megatron = T.model_copy(update={"step_pattern": r"iteration\s+(?P<step>\d+)/"})
    log = lines(JUDGING / "losses.log")[4:]
    assert read_log(log, megatron).losses == [3.356, 3.256, 3.156]
    assert diagnose(alive(log, 600, 1), megatron).verdict is Verdict.HEALTHY


# ---- 5. disk_full only from the trainer's words or a death the full disk explains ------------------------------

FULL, FAIRLY_FULL = parse_disks((JUDGING / "disks.txt").read_text().splitlines())


def test_a_sigkilled_run_on_a_fairly_full_disk_is_killed_and_relaunched_not_disk_full():
    d = diagnose(gone(lines(LOGS / "cpu/sigkill.log"), 137, disks=[FAIRLY_FULL]), T, min_free_disk_gb=5)
    assert (d.verdict, d.cause) == (Verdict.CRASHED, Cause.KILLED), d


def test_an_outside_sigkill_on_a_really_full_disk_is_still_killed():
    d = diagnose(gone(lines(LOGS / "cpu/sigkill.log"), 137, disks=[FULL]), T)
    assert d.cause is Cause.KILLED, d


def test_a_death_with_no_reason_of_its_own_on_a_really_full_disk_is_disk_full():
    d = diagnose(gone(lines(LOGS / "cpu/sigkill.log"), None, disks=[FULL, FAIRLY_FULL]), T)
    assert (d.cause, d.disk_still_full) == (Cause.DISK_FULL, True), d
    assert d.evidence[0].startswith("only 0.0 MB free of 1.0 MB at /ckpt/full: the disk is full"), d.evidence
    assert not any("fairly_full" in line for line in d.evidence)


def test_the_trainers_own_words_say_disk_full_and_the_minimum_says_whether_it_still_is():
    log = lines(LOGS / "cpu/disk_full_log_write.log")
    roomy = diagnose(gone(log, 1, disks=[FAIRLY_FULL]), T, min_free_disk_gb=1)
    low = diagnose(gone(log, 1, disks=[FAIRLY_FULL]), T, min_free_disk_gb=5)
    assert (roomy.cause, roomy.disk_still_full, low.cause, low.disk_still_full) == (Cause.DISK_FULL, False, Cause.DISK_FULL, True)
    assert low.evidence[0].startswith("only 3.80 GB free of 5.37 GB at /ckpt/fairly_full (minimum 5 GB)"), low.evidence


# ---- 6. kernel lines count only for the target's processes and GPUs ------------------------------------------


def test_an_oom_kill_of_another_jobs_process_is_not_the_runs_cause():
    kernel = lines(JUDGING / "other_oom.dmesg")
    d = diagnose(gone([], 137, pid=23527, tree_pids=[23527], kernel_lines=kernel), T)
    assert (d.verdict, d.cause) == (Verdict.CRASHED, Cause.KILLED), d
    assert any("not the run's (PID 23527)" in line and "Killed process 23528" in line for line in d.evidence), d.evidence


def test_an_oom_kill_of_a_worker_in_the_runs_tree_is_host_oom_and_without_the_tree_it_is_not():
    log, kernel = lines(JUDGING / "worker_oom_trainer.log"), lines(JUDGING / "worker_oom.dmesg")
    assert (JUDGING / "worker_oom_exit.txt").read_text().split() == ["trainer", "exit", "137"]
    with_tree = diagnose(gone(log, 137, pid=23334, tree_pids=[23334, 23339], kernel_lines=kernel), T)
    without = diagnose(gone(log, 137, pid=23334, kernel_lines=kernel), T)
    assert (with_tree.cause, without.cause) == (Cause.HOST_OOM_KILLED, Cause.KILLED)
    assert any("Killed process 23339" in line for line in with_tree.evidence)


GPU_HEALTH = parse_gpu_health((FIXTURES / "gpu_host/nvidia_smi_query_ecc.csv").read_text())


def test_an_xid_on_another_jobs_gpu_is_not_the_targets_gpu_fault():
    log, kernel = lines(LOGS / "cpu/generic_error.log"), lines(LOGS / "xid/xid79_journal.txt")  # Xid 79 on 00:06 = GPU 0
    snap = gone(log, 1, kernel_lines=kernel, gpu_health=GPU_HEALTH)
    assert diagnose(snap, T, gpu_indexes=[1]).cause is Cause.ERROR
    ours = diagnose(snap, T, gpu_indexes=[0])
    assert (ours.cause, ours.summary) == (Cause.GPU_FAULT, "GPU 0 (PCI 00000000:00:06.0): Xid 79: GPU has fallen off the bus")
    assert diagnose(snap, T).cause is Cause.GPU_FAULT, "no gpu_indexes: every GPU of the host is the target's"


def test_a_gpu_that_fell_off_the_bus_without_an_xid_counts_only_for_its_own_target():
    kernel = lines(LOGS / "xid/fallen_off_bus_multiline.txt")
    snap = gone(lines(LOGS / "cpu/generic_error.log"), 1, kernel_lines=kernel, gpu_health=GPU_HEALTH)
    assert diagnose(snap, T, gpu_indexes=[1]).cause is Cause.ERROR
    ours = diagnose(snap, T, gpu_indexes=[0])
    assert ours.cause is Cause.GPU_FAULT
    assert ours.evidence[:2] == [
        "kernel: [ 1843.308145] NVRM: The NVIDIA GPU 0000:00:06.0",
        "kernel: NVRM: fallen off the bus and is not responding to commands.",
    ]


# ---- 7. a checkpoint being written is progress ---------------------------------------------------------------


def saving(since_checkpoint_write: float | None) -> HealthSnapshot:
    """Steps printed until 400 s ago; checkpoint_dir written `since_checkpoint_write` seconds ago (host clock)."""
    log = [line for line in lines(JUDGING / "stepping_with_saves.log") if line.startswith("step=")]
    now = 5000.0
    written = None if since_checkpoint_write is None else LAUNCHED_AT + now - since_checkpoint_write
    return alive(log, now, 400, checkpoint_mtime_epoch=written)


def test_a_checkpoint_written_since_the_last_step_line_and_within_the_window_is_not_a_stall():
    d = diagnose(saving(30), T)
    assert d.verdict is Verdict.HEALTHY, d
    assert any("checkpoint_dir was written 30 s ago: a save in progress" in line for line in d.evidence), d.evidence


def test_no_checkpoint_write_or_one_older_than_the_window_leaves_the_stall_a_stall():
    assert diagnose(saving(None), T).verdict is Verdict.STALLED
    assert diagnose(saving(350), T).verdict is Verdict.STALLED, "written after the last step, but 350 s ago: window 300 s"
    assert diagnose(saving(500), T).verdict is Verdict.STALLED, "written before the last step line"


def test_progress_keeps_the_newest_checkpoint_write_across_polls():
    p = advance(Progress(), saving(30), T)
    assert p.checkpoint_written_at == 4970.0
    later = saving(None).model_copy(update={"seconds_since_launch": 5010.0, "seconds_since_log_write": 410.0})
    p = advance(p, later, T)
    assert p.checkpoint_written_at == 4970.0
    assert diagnose(later, T, p).verdict is Verdict.HEALTHY, "40 s after the write: still within the window"


# ---- 8. runs relaunch does not own, and runs a person stopped --------------------------------------------------

TOP = (JUDGING / "foreign_top.txt").read_text().strip()  # `25467 top -d 5`


def test_a_session_holding_a_program_that_is_no_trainer_is_unmanaged_and_nothing_is_stopped():
    snap = HealthSnapshot(launched=True, session_alive=True, pid=4242, pid_alive=False, exit_code=143, foreign=[TOP])
    d = diagnose(snap, T)
    assert (d.verdict, d.cause) == (Verdict.UNMANAGED, Cause.NOT_A_TRAINER)
    assert d.summary == "the target's session holds `top -d 5` (pid 25467), not a training run: nothing stopped"
    assert any("relaunch adopt TARGET --log PATH" in line for line in d.evidence)
    assert not d.verdict.needs_recovery() and not d.verdict.is_fine()


def test_relaunchs_trainer_alive_outside_a_session_that_holds_another_run_is_two_trainers():
    snap = alive(lines(JUDGING / "stepping_with_saves.log"), 600, 1, foreign=[TOP])
    d = diagnose(snap, T)
    assert (d.verdict, d.cause) == (Verdict.UNMANAGED, Cause.TWO_TRAINERS)
    assert d.summary == (
        "relaunch's trainer PID 4242 runs outside the target's session while the session holds `top -d 5` (pid 25467): "
        "two trainers of one target; nothing stopped"
    )


def test_a_run_relaunch_did_not_start_with_its_log_found_is_to_be_adopted():
    snap = HealthSnapshot(launched=True, session_alive=True, foreign=[TOP], foreign_log="/workspace/train_stdout_clean.log")
    d = diagnose(snap, T)
    assert (d.verdict, d.cause) == (Verdict.UNMANAGED, None)
    assert d.summary == (
        "the target's session holds a run relaunch did not start, writing /workspace/train_stdout_clean.log: "
        "adopt it (relaunch adopt TARGET)"
    )


def test_a_run_stopped_on_purpose_is_stopped_until_recovered_and_a_live_trainer_is_judged_as_usual():
    stopped = gone(lines(LOGS / "cpu/sigkill.log"), 143, stopped_at=1_764_651_600.0)
    d = diagnose(stopped, T)
    assert d.verdict is Verdict.STOPPED and d.verdict.is_fine() and not d.verdict.needs_recovery()
    assert d.summary == "stopped on purpose (relaunch stop) at 2025-12-02 05:00:00 UTC; relaunch recover starts it again"
    running = alive(lines(JUDGING / "stepping_with_saves.log"), 600, 1, stopped_at=1_764_651_600.0)
    assert diagnose(running, T).verdict is Verdict.HEALTHY


def test_an_adopted_run_that_died_silently_is_a_silent_exit_whose_exit_code_cannot_be_known():
    steps = lines(JUDGING / "stepping_with_saves.log")
    d = diagnose(gone(steps, None, adopted=True), T)
    assert d.cause is Cause.SILENT_EXIT
    assert "no exit code: an adopted run's exit code cannot be known (relaunch did not start it)" in d.evidence
    assert diagnose(gone(lines(LOGS / "cpu/generic_error.log"), None, adopted=True), T).cause is Cause.ERROR


# ---- the exit record and the session's end: which came first decides -------------------------------------------

DEATHS = [
    (LOGS / "gpu/fx_race_cuda.log", 1, Cause.FX_TRACING_RACE),
    (LOGS / "cpu/generic_error.log", 1, Cause.ERROR),
    (LOGS / "cpu/sigkill.log", 137, Cause.KILLED),
]


@settings(max_examples=60, deadline=None)
@given(death=st.sampled_from(DEATHS), exited_at=st.floats(1e9, 2e9), gap=st.floats(0.001, 3600.0))
def test_a_session_that_ends_after_its_trainer_died_is_the_death_not_a_deliberate_stop(death, exited_at, gap):
    # The next launch closed the pane, or the tmux server went, while a process of the dead run was on its way out:
    # the launcher's hangup wrote STATE/stopped after the exit record. The crash must still be recovered.
    log, code, cause = death
    how = "tmux session ended (tmux kill-session, kill-server or the tmux server gone)"
    later = gone(lines(log), code, exit_at_epoch=exited_at, stopped_at=exited_at + gap, stopped_how=how)
    d = diagnose(later, T)
    assert (d.verdict, d.cause) == (Verdict.CRASHED, cause), d
    # A person's kill-session of a live trainer is recorded before the trainer's death: a deliberate stop.
    before = gone(lines(log), code, exit_at_epoch=exited_at, stopped_at=exited_at - gap, stopped_how=how)
    assert diagnose(before, T).verdict is Verdict.STOPPED
    # `relaunch stop` records its stop once the trainer is gone, always after the exit: that stop stands.
    asked = gone(lines(log), code, exit_at_epoch=exited_at, stopped_at=exited_at + gap)
    assert diagnose(asked, T).verdict is Verdict.STOPPED


@settings(max_examples=30, deadline=None)
@given(death=st.sampled_from(DEATHS))
def test_a_dead_trainer_whose_exit_code_the_supervisor_is_still_recording_is_watched_not_judged_a_silent_exit(death):
    log, _, _ = death
    recording = diagnose(gone(lines(log), None, supervisor_alive=True), T)
    assert not recording.settled and recording.watching == "the supervisor recording the trainer's exit code"
    # Once the supervisor is gone without writing one (SIGKILLed with its group), the death without a code is judged.
    assert diagnose(gone(lines(log), None, supervisor_alive=False), T).settled
    # An adopted run has no supervisor of relaunch's to wait for.
    assert diagnose(gone(lines(log), None, supervisor_alive=True, adopted=True), T).settled
