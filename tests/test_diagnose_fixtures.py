"""Every captured failure gets the right verdict and cause, from the pure function and from `relaunch diagnose`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relaunch.cli.app import app

LOGS = Path(__file__).parent / "fixtures" / "logs"

# fixture, options, verdict, cause, package, a line the evidence must quote
CASES = [
    # A saved log names no PID of the run (issue 35): the kernel's OOM kill of a process named like the trainer (python),
    # with exit 137, is the run's, and the evidence says the PID was not given.
    (
        "cpu/host_oom_killed.log",
        ["--exit-code", "137", "--dmesg", str(LOGS / "cpu/host_oom_killed.dmesg")],
        "crashed",
        "host_oom_killed",
        None,
        "PID not given",
    ),
    # Given the trainer's PID, only a kill of that PID is the run's (issue 25): another's is quoted as another's.
    (
        "cpu/host_oom_killed.log",
        ["--exit-code", "137", "--dmesg", str(LOGS / "cpu/host_oom_killed.dmesg"), "--pid", "4242"],
        "crashed",
        "killed",
        None,
        "Killed process 5622",
    ),
    ("cpu/host_oom_killed.log", ["--exit-code", "137"], "crashed", "killed", None, "SIGKILL"),
    ("cpu/python_memoryerror.log", ["--exit-code", "1"], "crashed", "error", None, "MemoryError"),
    ("cpu/compile_error.log", ["--exit-code", "1"], "crashed", "compile_error", None, "CppCompileError"),
    ("cpu/compile_error_invalid_cxx.log", ["--exit-code", "1"], "crashed", "compile_error", None, "InvalidCxxCompiler"),
    ("cpu/generic_error.log", ["--exit-code", "1"], "crashed", "error", None, "KeyError: 'labels'"),
    ("cpu/sigterm.log", ["--exit-code", "143"], "crashed", "killed", None, "SIGTERM"),
    # A trainer ended by a signal inside a wrapper script that went on and exited 0: its shell's job line says so.
    ("cpu/wrapped_sigkill.log", ["--exit-code", "0"], "crashed", "killed", None, "Killed                  python -u signal_trainer.py"),
    ("cpu/wrapped_sigterm.log", ["--exit-code", "0"], "crashed", "killed", None, "Terminated"),
    ("cpu/wrapped_sigsegv.log", ["--exit-code", "0"], "crashed", "native_crash", None, "Segmentation fault"),
    ("cpu/wrapped_sigabrt.log", ["--exit-code", "0"], "crashed", "native_crash", None, "Aborted"),
    ("cpu/sigkill.log", ["--exit-code", "137"], "crashed", "killed", None, "SIGKILL"),
    ("cpu/sigkill.log", [], "crashed", "silent_exit", None, "no exit code recorded"),
    ("cpu/missing_dependency_library.log", ["--exit-code", "1"], "crashed", "missing_dependency", "accelerate", "pip install accelerate"),
    (
        "cpu/missing_dependency_dotted.log",
        ["--exit-code", "1"],
        "crashed",
        "missing_dependency",
        "scikit-learn",
        "No module named 'sklearn'",
    ),
    ("gpu/cuda_oom.log", ["--exit-code", "1"], "crashed", "cuda_oom", None, "CUDA out of memory"),
    ("gpu/fx_race_cuda.log", ["--exit-code", "1"], "crashed", "fx_tracing_race", None, "dynamo-optimized function"),
    ("gpu/nccl_failure.log", ["--exit-code", "1"], "crashed", "distributed_failure", None, "DistBackendError"),
    ("gpu/nccl_then_oom.log", ["--exit-code", "1"], "crashed", "distributed_failure", None, "DistBackendError"),
    (
        "gpu/flex_uncompiled.log",
        ["--running", "--seconds-since-log-write", "1", "--baseline-tokens-per-second", "4295000"],
        "degraded",
        None,
        None,
        "flex_attention called without torch.compile()",
    ),
    (
        "gpu/flex_compiled.log",
        ["--running", "--seconds-since-log-write", "1", "--baseline-tokens-per-second", "4295000"],
        "healthy",
        None,
        None,
        "step=2580",
    ),
    (
        "demo/fx_race_cpu_module_call.log",
        ["--exit-code", "1"],
        "crashed",
        "fx_tracing_race",
        None,
        "NameError: module is not installed as a submodule",
    ),
    (
        "demo/fx_race_cpu_multiple_tracers.log",
        ["--exit-code", "134"],
        "crashed",
        "fx_tracing_race",
        None,
        "Found multiple different tracers",
    ),
    (
        "demo/fx_race_cpu_patcher.log",
        ["--exit-code", "134"],
        "crashed",
        "fx_tracing_race",
        None,
        "CURRENT_PATCHER is None in finally block",
    ),
    ("demo/missing_dependency.log", ["--exit-code", "1"], "crashed", "missing_dependency", "tinyaccel", "No module named 'tinyaccel'"),
    ("demo/silent_death.log", [], "crashed", "silent_exit", None, "no exit code recorded"),
    (
        "demo/degraded_uncompiled.log",
        ["--running", "--seconds-since-log-write", "1", "--baseline-tokens-per-second", "30000"],
        "degraded",
        None,
        None,
        "called without torch.compile()",
    ),
    ("demo/hang.log", ["--running", "--seconds-since-log-write", "600"], "stalled", None, None, "no new step line"),
    ("cpu/disk_full_torch_save.log", ["--exit-code", "1"], "crashed", "disk_full", None, "basic_ios::clear: iostream error"),
    ("cpu/disk_full_log_write.log", ["--exit-code", "1"], "crashed", "disk_full", None, "[Errno 28] No space left on device"),
    ("cpu/segfault.log", ["--exit-code", "139"], "crashed", "native_crash", None, "SIGSEGV"),
    ("cpu/segfault_faulthandler.log", ["--exit-code", "139"], "crashed", "native_crash", None, "Fatal Python error: Segmentation fault"),
    ("cpu/abort.log", ["--exit-code", "134"], "crashed", "native_crash", None, "SIGABRT"),
    ("cpu/dataloader_bus_error.log", ["--exit-code", "1"], "crashed", "disk_full", None, "unable to allocate shared memory(shm)"),
    ("cpu/truncated_checkpoint_load.log", ["--exit-code", "1"], "crashed", "broken_checkpoint", None, "failed finding central directory"),
    ("gpu/nan_loss.log", ["--running", "--seconds-since-log-write", "1"], "diverged", None, None, "first non-finite at step 633"),
    ("gpu/device_side_assert.log", ["--exit-code", "1"], "crashed", "error", None, "device-side assert triggered"),
    ("gpu/illegal_memory_access.log", ["--exit-code", "1"], "crashed", "error", None, "an illegal memory access was encountered"),
    (
        "gpu/nccl_watchdog_timeout.log",
        ["--exit-code", "1"],
        "crashed",
        "distributed_failure",
        None,
        "Watchdog caught collective operation timeout",
    ),
    (
        "ansi_colored_traceback.log",
        ["--exit-code", "1"],
        "crashed",
        "error",
        None,
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied",
    ),
    ("carriage_return_progress.log", ["--running", "--seconds-since-log-write", "1"], "healthy", None, None, "step=164"),
    (
        "xid/cuda_ecc_trainer.log",
        ["--exit-code", "1", "--dmesg", str(LOGS / "xid/xid79_journal.txt")],
        "crashed",
        "gpu_fault",
        None,
        "Xid 79: GPU has fallen off the bus",
    ),
    ("xid/cuda_ecc_trainer.log", ["--exit-code", "1"], "crashed", "gpu_fault", None, "uncorrectable ECC error"),
    # Issue 26: what was misread. Distributed failures beyond NCCL (gloo on the CPU, 2 ranks).
    ("cpu/gloo_peer_lost.log", ["--exit-code", "1"], "crashed", "distributed_failure", None, "Connection closed by peer"),
    ("cpu/gloo_peer_lost_torchrun.log", ["--exit-code", "1"], "crashed", "distributed_failure", None, "Connection closed by peer"),
    (
        "cpu/torchrun_restarts_exhausted.log",
        ["--exit-code", "1"],
        "crashed",
        "distributed_failure",
        None,
        "worker group failure 2: local_rank",
    ),
    ("cpu/rendezvous_timeout_c10d.log", ["--exit-code", "1"], "crashed", "distributed_failure", None, "join_timeout"),
    ("cpu/rendezvous_timeout_static.log", ["--exit-code", "1"], "crashed", "distributed_failure", None, "1 of 2 nodes"),
    ("cpu/tcpstore_rank_never_joins.log", ["--exit-code", "1"], "crashed", "distributed_failure", None, "1 of 2 ranks"),
    ("cpu/tcpstore_no_master.log", ["--exit-code", "1"], "crashed", "distributed_failure", None, "127.0.0.1:29614"),
    # Preemption: SIGTERM to torchrun (its SignalException, exit 1), to a trainer that saves on it (exit 143).
    ("cpu/torchrun_sigterm.log", ["--exit-code", "1"], "crashed", "killed", None, "got signal: 15"),
    ("cpu/sigterm_saves_checkpoint.log", ["--exit-code", "143"], "crashed", "killed", None, "SIGTERM"),
    # Intact checkpoints that will not load: not broken ones.
    (
        "cpu/checkpoint_weights_only.log",
        ["--exit-code", "1"],
        "crashed",
        "checkpoint_incompatible",
        None,
        "GLOBAL argparse.Namespace was not an allowed global",
    ),
    ("cpu/checkpoint_state_dict_mismatch.log", ["--exit-code", "1"], "crashed", "checkpoint_incompatible", None, "size mismatch for"),
    # A DataLoader worker the OOM killer took: the kernel names the worker the trainer names.
    (
        "cpu/dataloader_worker_oom_killed.log",
        ["--exit-code", "1", "--dmesg", str(LOGS / "cpu/dataloader_worker_oom_killed.dmesg")],
        "crashed",
        "host_oom_killed",
        None,
        "Memory cgroup out of memory: Killed process",
    ),
    ("cpu/dataloader_worker_oom_killed.log", ["--exit-code", "1"], "crashed", "native_crash", None, "is killed by signal: Killed"),
    # A damaged inductor cache: the generated modules cut short kill the run; damaged entries are recompiled past.
    (
        "cpu/compile_cache_module_truncated.log",
        ["--exit-code", "1"],
        "crashed",
        "corrupt_cache",
        None,
        "Failed to import",
    ),
    ("cpu/compile_cache_entries_truncated.log", ["--running", "--seconds-since-log-write", "1"], "healthy", None, None, "step=1299"),
    ("cpu/compile_cache_entries_truncated.log", ["--exit-code", "137"], "crashed", "killed", None, "SIGKILL"),
    ("cpu/compile_cache_module_cut_short.log", ["--exit-code", "1"], "crashed", "corrupt_cache", None, "No module named 'r'"),
    ("demo/corrupt_cache_cpu.log", ["--exit-code", "134"], "crashed", "corrupt_cache", None, "Failed to import"),
    # Triton's cache damaged on the H200 (tests/fixtures/logs/gpu/PROVENANCE.md, bench/gpu_capture/capture_cache.sh).
    ("gpu/cache_cubin_garbage.log", ["--exit-code", "1"], "crashed", "corrupt_cache", None, "device kernel image is invalid"),
    ("gpu/cache_cubin_garbage_rerun.log", ["--exit-code", "1"], "crashed", "corrupt_cache", None, "device kernel image is invalid"),
    # The corrupt-cache demo's broken run on the H200 (gpu/demo/corrupt-cache/PROVENANCE.md).
    (
        "gpu/demo/corrupt-cache/relaunch-demo-corrupt-cache-20261202T133420.676469Z-a0.log",
        ["--exit-code", "1"],
        "crashed",
        "corrupt_cache",
        None,
        "device kernel image is invalid",
    ),
    ("gpu/cache_so_half_faulthandler.log", ["--exit-code", "135"], "crashed", "corrupt_cache", None, "in _load_module_from_path"),
    ("gpu/cache_prefix_all.log", ["--exit-code", "135"], "crashed", "corrupt_cache", None, "fx graph cache unable to load"),
    # A SIGBUS or SIGSEGV that leaves no text names nothing: a native crash (PYTHONFAULTHANDLER=1 makes it readable).
    ("gpu/cache_so_half.log", ["--exit-code", "135"], "crashed", "native_crash", None, "SIGBUS"),
    ("gpu/cache_cubin_half.log", ["--exit-code", "139"], "crashed", "native_crash", None, "SIGSEGV"),
    ("gpu/cache_fxgraph_half.log", ["--running", "--seconds-since-log-write", "1"], "healthy", None, None, "step="),
    ("gpu/cache_aotautograd_half.log", ["--running", "--seconds-since-log-write", "1"], "healthy", None, None, "step="),
    # Its unraisable __del__ AttributeError is no failure: a later kill reads as the kill.
    ("gpu/cache_fxgraph_half.log", ["--exit-code", "137"], "crashed", "killed", None, "SIGKILL"),
    ("cpu/compile_cache_truncated.log", ["--running", "--seconds-since-log-write", "1"], "healthy", None, None, "step=1299"),
    # Kernels overwritten with garbage: torch rebuilt them and the rebuild failed; a compile error, whose remedy clears the cache.
    ("cpu/compile_cache_so_overwritten.log", ["--exit-code", "1"], "crashed", "compile_error", None, "CppCompileError"),
    # A two-node gang on the H200, a rank on node 1 SIGKILLed (gpu/gang/PROVENANCE.md): each node's own log.
    (
        "gpu/gang/node1_a0.log",
        ["--exit-code", "1"],
        "crashed",
        "killed",
        None,
        "rank 1 (local_rank 0, pid 1712, host localhost) died of SIGKILL",
    ),
    ("gpu/gang/node0_a0.log", ["--exit-code", "1"], "crashed", "distributed_failure", None, "ChildFailedError"),
    # Issue 48: a wrapper's exit 0 over an uncaught exception (tee without pipefail, a script's last line) is the trainer's
    # error; a thread's or child's traceback at the end of a run that exited 0 is not.
    ("cpu/tee_traceback.log", ["--exit-code", "0"], "crashed", "error", None, "exit code 0 recorded, but it is a wrapper's"),
    ("cpu/wrapped_traceback_echo.log", ["--exit-code", "0"], "crashed", "error", None, "No such file or directory"),
    ("cpu/torchrun_tee_traceback.log", ["--exit-code", "0"], "crashed", "error", None, "rank1/shard_00003.bin"),
    ("cpu/background_thread_traceback.log", ["--exit-code", "0"], "finished", None, None, "/nonexistent/metrics.jsonl"),
    # A pickled class a refactor moved or renamed: the code refuses an intact checkpoint; the same file loads with the old code.
    ("cpu/checkpoint_class_moved.log", ["--exit-code", "1"], "crashed", "checkpoint_incompatible", None, "the checkpoint is intact"),
    ("cpu/checkpoint_class_renamed.log", ["--exit-code", "1"], "crashed", "checkpoint_incompatible", None, "Can't get attribute"),
    ("cpu/checkpoint_class_restored.log", ["--exit-code", "0"], "finished", None, None, "step=805"),
    # numpy's short write is a full disk; a monitored barrier's timeout names the rank that never arrived.
    ("cpu/numpy_short_write.log", ["--exit-code", "1"], "crashed", "disk_full", None, "8176 of 100000 items written"),
    ("cpu/monitored_barrier_timeout.log", ["--exit-code", "1"], "crashed", "distributed_failure", None, "rank 1 never reached"),
    ("cpu/monitored_barrier_torchrun.log", ["--exit-code", "1"], "crashed", "distributed_failure", None, "rank 1 never reached"),
    (
        "cpu/monitored_barrier_all_ranks_torchrun.log",
        ["--exit-code", "1"],
        "crashed",
        "distributed_failure",
        None,
        "ranks 1, 2 never reached the monitored barrier",
    ),
]


@pytest.mark.parametrize(
    ("fixture", "options", "verdict", "cause", "package", "quoted"),
    CASES,
    ids=[f"{c[0]}{' ' + ' '.join(c[1][:2]) if c[1] else ''}" for c in CASES],
)
def test_diagnose_names_the_verdict_cause_and_evidence_of_each_captured_failure(fixture, options, verdict, cause, package, quoted):
    result = CliRunner().invoke(app, ["diagnose", str(LOGS / fixture), *options, "--json"])
    assert result.exit_code == (0 if verdict in ("healthy", "starting", "finished") else 1), result.output
    out = json.loads(result.output)
    assert (out["verdict"], out["cause"], out["package"]) == (verdict, cause, package)
    assert any(quoted in line for line in out["evidence"]), out["evidence"]


def test_diagnose_reads_throughput_and_last_step_into_metrics():
    result = CliRunner().invoke(
        app, ["diagnose", str(LOGS / "gpu/flex_compiled.log"), "--running", "--seconds-since-log-write", "1", "--json"]
    )
    metrics = json.loads(result.output)["metrics"]
    assert metrics["last_step"] == 2580
    assert metrics["tokens_per_second"] == pytest.approx(4294400, rel=0.01)


def named_in(text: str) -> set[str]:
    """File names a PROVENANCE.md names: each whole name, and each numbered series written `poll_1.txt .. poll_12.txt`."""
    names = set(re.findall(r"[\w.-]*\w", text))
    for stem, first, ext, stem2, last, ext2 in re.findall(r"`?([\w.-]*?)(\d+)(\.\w+)`? *\.\. *`?([\w.-]*?)(\d+)(\.\w+)`?", text):
        if (stem, ext) == (stem2, ext2):
            names |= {f"{stem}{n}{ext}" for n in range(int(first), int(last) + 1)}
    return names


def test_every_fixture_has_its_provenance_written_next_to_it():
    """Every file in every folder under tests/fixtures (any name, not only *.log) is named in that folder's PROVENANCE.md."""
    fixtures = LOGS.parent
    problems = []
    for folder in sorted({p.parent for p in fixtures.rglob("*") if p.is_file()}):
        where = folder.relative_to(fixtures).as_posix()
        files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != "PROVENANCE.md")
        if not files:
            continue
        provenance = folder / "PROVENANCE.md"
        if not provenance.is_file():
            problems.append(f"{where}/ has no PROVENANCE.md (its files: {', '.join(files)})")
            continue
        named = named_in(provenance.read_text())
        problems += [f"{where}/{name} has no provenance line" for name in files if name not in named]
    assert not problems, "\n".join(problems)
