"""The rules of the verdict, one test each, on snapshots built from real captured output."""

from __future__ import annotations

from pathlib import Path

from relaunch.config import Thresholds
from relaunch.judging.alive import stall_window_seconds
from relaunch.judging.diagnosis import advance, diagnose
from relaunch.judging.findings import Progress
from relaunch.judging.gone import missing_package
from relaunch.judging.snapshot import HealthSnapshot
from relaunch.plans.health import parse_gpu_csv
from relaunch.vocabulary import Cause, Verdict

LOGS = Path(__file__).parent / "fixtures" / "logs"
SAMPLES = Path(__file__).parent / "fixtures" / "samples"
COMPILED = (LOGS / "gpu/flex_compiled.log").read_text().splitlines()
LOADING = [line for line in COMPILED if "step=" not in line][:2] or ["loading"]
T = Thresholds(startup_grace_seconds=900, stall_window_floor_seconds=300, healthy_steps=3)


def alive(**kw) -> HealthSnapshot:
    return HealthSnapshot(launched=True, session_alive=True, pid=1, pid_alive=True, **kw)


def test_a_live_trainer_without_step_lines_is_starting_within_its_grace_even_after_minutes():
    snap = alive(seconds_since_launch=7 * 60, seconds_since_log_write=200, log_tail=LOADING)
    assert diagnose(snap, T).verdict is Verdict.STARTING


def test_a_start_up_past_its_grace_that_still_writes_its_log_is_not_stalled():
    snap = alive(seconds_since_launch=1200, seconds_since_log_write=5, log_tail=LOADING, log_size_bytes=100)
    d = diagnose(snap, T)
    assert d.verdict is Verdict.STARTING
    assert any("past its" in e for e in d.evidence)


def test_a_start_up_past_its_grace_with_no_progress_for_the_window_is_stalled():
    snap = alive(seconds_since_launch=1500, seconds_since_log_write=400, log_tail=LOADING)
    assert diagnose(snap, T).verdict is Verdict.STALLED


def test_rising_gpu_memory_counts_as_start_up_progress():
    t = Thresholds(startup_grace_seconds=60, stall_window_floor_seconds=300)
    p = Progress()
    for second, mib in ((400, 1000), (700, 20000)):
        gpus = parse_gpu_csv(f"0, {mib} MiB, 0 %")
        snap = alive(seconds_since_launch=second, seconds_since_log_write=second, log_tail=LOADING, gpus=gpus)
        p = advance(p, snap, t)
    assert diagnose(snap, t, p).verdict is Verdict.STARTING


def test_no_new_step_line_for_the_stall_window_is_stalled_and_says_so():
    snap = alive(seconds_since_launch=5000, seconds_since_log_write=900, log_tail=COMPILED)
    d = diagnose(snap, T)
    assert d.verdict is Verdict.STALLED
    assert any("no new step line" in e for e in d.evidence)


def test_the_stall_window_follows_the_observed_step_interval_above_its_floor():
    p = Progress(step_intervals=(60.0, 60.0, 61.0))
    assert stall_window_seconds(p, T) == 600
    assert stall_window_seconds(Progress(step_intervals=(1.0,)), T) == 300


def test_steps_at_the_baseline_are_healthy_and_far_below_it_degraded():
    snap = alive(seconds_since_launch=5000, seconds_since_log_write=1, log_tail=COMPILED)
    assert diagnose(snap, T.model_copy(update={"baseline_tokens_per_second": 4_300_000})).verdict is Verdict.HEALTHY
    assert diagnose(snap, T.model_copy(update={"baseline_tokens_per_second": 21_500_000})).verdict is Verdict.DEGRADED


def test_throughput_is_read_in_common_formats_and_a_custom_pattern():
    from relaunch.judging.reading import read_log

    lines = ["step=1 (20.0Ktok/s)", "step=2 21500 tok/s", "step=4 1.5M tokens/s", "step=5 900 tok/sec"]
    assert read_log(lines, T).throughputs == [20000.0, 21500.0, 1_500_000.0, 900.0]
    custom = T.model_copy(update={"throughput_pattern": r"tput=(?P<value>\d+)"})
    assert read_log(["step=9 tput=123"], custom).throughputs == [123.0]


def test_every_expected_gpu_at_zero_while_the_trainer_claims_to_live_is_evidence():
    gpus = parse_gpu_csv((SAMPLES / "nvidia-smi_8gpu_all_idle_from_seeds.csv").read_text())
    snap = alive(seconds_since_launch=5000, seconds_since_log_write=1, log_tail=COMPILED, gpus=gpus)
    d = diagnose(snap, T.model_copy(update={"expected_gpus": 8}))
    assert "every expected GPU (8) at 0 MiB while the trainer is alive" in d.evidence


def test_zero_utilisation_for_the_whole_stall_window_is_evidence():
    t = T.model_copy(update={"stall_window_floor_seconds": 100})
    idle = parse_gpu_csv((SAMPLES / "nvidia-smi_h200_idle.csv").read_text())
    p = Progress()
    for second in (10, 200):
        snap = alive(seconds_since_launch=second, seconds_since_log_write=1, log_tail=LOADING, gpus=idle)
        p = advance(p, snap, t)
    assert any("utilisation 0 %" in e for e in diagnose(snap, t, p).evidence)


def test_gpu_csv_is_parsed_with_and_without_units():
    busy = parse_gpu_csv((SAMPLES / "nvidia-smi_h200_busy.csv").read_text())
    assert (busy[0].memory_used_mib, busy[0].utilization_percent) == (1849, 100)
    assert parse_gpu_csv("3, 512, 7")[0].utilization_percent == 7


def test_the_first_failure_in_time_wins_over_its_knock_on_effects():
    lines = (LOGS / "gpu/nccl_then_oom.log").read_text().splitlines()
    d = diagnose(HealthSnapshot(launched=True, exit_code=1, log_tail=lines), T)
    assert d.cause is Cause.DISTRIBUTED_FAILURE
    assert not any("out of memory" in e for e in d.evidence)


def test_the_package_to_install_is_the_distribution_not_the_module_path():
    assert missing_package("ModuleNotFoundError: No module named 'sklearn.linear_model'") == "scikit-learn"
    assert missing_package("ModuleNotFoundError: No module named 'flash_attn.ops'") == "flash-attn"
    line = next(x for x in (LOGS / "cpu/missing_dependency_library.log").read_text().splitlines() if "pip install" in x)
    assert missing_package(line) == "accelerate"


def test_a_warning_that_mentions_a_missing_module_is_not_a_missing_dependency():
    warning = next(x for x in (LOGS / "cpu/generic_error.log").read_text().splitlines() if "Failed to initialize NumPy" in x)
    assert missing_package(warning) is None


def test_exit_137_with_the_kernels_oom_line_is_host_oom_not_killed():
    lines = (LOGS / "cpu/host_oom_killed.log").read_text().splitlines()
    kernel = (LOGS / "cpu/host_oom_killed.dmesg").read_text().splitlines()
    # The captured kill names pid 5622, the trainer's own PID in that capture: the line decides only for that PID
    # (issue 25: a kernel line about another process is not this run's cause).
    with_kernel = diagnose(HealthSnapshot(launched=True, pid=5622, exit_code=137, log_tail=lines, kernel_lines=kernel), T)
    without = diagnose(HealthSnapshot(launched=True, pid=5622, exit_code=137, log_tail=lines), T)
    assert (with_kernel.cause, without.cause) == (Cause.HOST_OOM_KILLED, Cause.KILLED)


def test_a_vanished_session_without_exit_code_or_traceback_is_a_silent_exit():
    lines = (LOGS / "cpu/sigkill.log").read_text().splitlines()
    d = diagnose(HealthSnapshot(launched=True, session_alive=False, pid_alive=False, log_tail=lines), T)
    assert (d.verdict, d.cause) == (Verdict.CRASHED, Cause.SILENT_EXIT)


def test_exit_zero_is_finished_and_nothing_on_record_is_unknown():
    assert diagnose(HealthSnapshot(launched=True, exit_code=0, log_tail=COMPILED), T).verdict is Verdict.FINISHED
    assert diagnose(HealthSnapshot(launched=False), T).verdict is Verdict.UNKNOWN
