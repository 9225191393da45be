"""The rules over a run's progress record (relaunch/judging/progress.py), over generated records: sequences of samples
of a tree whose processes are born and end, burn CPU, read and write, stop, wait on locks, and whose GPUs are busy or
idle. The properties are what an expert at the host holds to (issue 50):

- never a stall (flat, blocked, GPU spin) while any counter of the tree rises within the window;
- never anything but paused while a process of the tree is stopped by a signal (T);
- stalled within one window of the moment everything went flat;
- a record shorter than the window is watched, never judged on one look.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from relaunch.judging.activity import IDLE_CORES, stack_sample
from relaunch.judging.progress import GPU_BUSY_PERCENT, IO_IDLE_BYTES_PER_SECOND, Motion, read_progress
from relaunch.judging.snapshot import GpuApp, GpuUse, LockWait, ProcessSample, ProgressSample
from relaunch.plans.health import parse_progress

EVERY = 1.0  # seconds between samples
WINDOW = 10.0


@dataclass
class Step:
    """What changes between two samples, for each of the tree's processes (by slot) and the log and GPU."""

    ticks: tuple[int, ...]
    io: tuple[int, ...]
    log: int
    gpu: int


def quiet_step(n: int) -> Step:
    return Step(ticks=(0,) * n, io=(0,) * n, log=0, gpu=0)


steps = st.integers(min_value=1, max_value=3).flatmap(
    lambda n: st.lists(
        st.builds(
            Step,
            ticks=st.tuples(*[st.integers(0, 200)] * n),
            io=st.tuples(*[st.integers(0, 1_000_000)] * n),
            log=st.integers(0, 300),
            gpu=st.sampled_from([0, 0, 30, 100]),
        ),
        min_size=1,
        max_size=40,
    )
)


def record(changes: list[Step], states: dict[int, str] | None = None, gpu: bool = True) -> list[ProgressSample]:
    """Samples EVERY s apart: the tree's counters advanced by each step in turn. `states`: slot -> state at the end."""
    n = len(changes[0].ticks)
    ticks, io, log = [100] * n, [1000] * n, 50
    out = []
    for i, change in enumerate([quiet_step(n), *changes]):
        ticks = [a + b for a, b in zip(ticks, change.ticks)]
        io = [a + b for a, b in zip(io, change.io)]
        log += change.log
        last = i == len(changes)
        procs = [
            ProcessSample(
                pid=100 + k,
                state=(states or {}).get(k, "S") if last else "S",
                cpu_ticks=ticks[k],
                io_bytes=io[k],
                wchan="futex_do_wait",
                comm="python",
            )
            for k in range(n)
        ]
        gpus = [GpuUse(index=0, utilization_percent=change.gpu, memory_used_mib=1000, bus_id="00:01.0")] if gpu else []
        apps = [GpuApp(pid=100, used_memory_mib=1000)] if gpu else []
        out.append(
            ProgressSample(
                at_epoch=1000.0 + i * EVERY,
                log_size_bytes=log,
                processes=procs,
                gpus=gpus,
                gpu_apps=apps,
                gpu_app_buses={100: "00:01.0"} if gpu else {},
            )
        )
    return out


def rises(change: Step) -> bool:
    """A change an expert calls work: CPU or I/O above what a heartbeat costs, a log write, a busy GPU."""
    return (
        sum(change.ticks) / 100 / EVERY >= IDLE_CORES
        or sum(change.io) / EVERY >= IO_IDLE_BYTES_PER_SECOND
        or change.log > 0
        or change.gpu > 0
    )


def host_rises(change: Step) -> bool:
    return sum(change.io) / EVERY >= IO_IDLE_BYTES_PER_SECOND or change.log > 0


@settings(max_examples=300, deadline=None)
@given(steps)
def test_a_tree_whose_counters_rise_within_the_window_is_never_called_stalled(changes):
    samples = record(changes)
    reading = read_progress(samples, WINDOW, EVERY)
    in_window = changes[-int(WINDOW / EVERY) :]
    if any(rises(c) for c in in_window) and reading.motion is not Motion.GPU_SPIN:
        assert reading.motion not in (Motion.FLAT, Motion.BLOCKED), (reading, in_window)
    if any(host_rises(c) for c in in_window):
        assert not reading.motion.is_quiet(), (reading, in_window)


@settings(max_examples=200, deadline=None)
@given(steps, st.data())
def test_a_tree_with_a_process_stopped_by_a_signal_is_paused_whatever_else_it_does(changes, data):
    n = len(changes[0].ticks)
    slot = data.draw(st.integers(0, n - 1))
    reading = read_progress(record(changes, {slot: "T"}), WINDOW, EVERY)
    assert reading.motion is Motion.PAUSED
    assert 100 + slot in reading.pids


@settings(max_examples=200, deadline=None)
@given(steps, st.integers(min_value=int(WINDOW / EVERY), max_value=40), st.booleans())
def test_a_tree_that_went_flat_is_stalled_within_one_window_of_it(changes, flat_for, gpu):
    n = len(changes[0].ticks)
    samples = record([*changes, *[quiet_step(n)] * flat_for], gpu=gpu)
    reading = read_progress(samples, WINDOW, EVERY)
    assert reading.motion is Motion.FLAT, reading
    assert reading.quiet_seconds >= WINDOW


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=int(WINDOW / EVERY) - 1))
def test_a_record_shorter_than_the_window_is_watched_never_judged(count):
    reading = read_progress(record([quiet_step(1)] * count), WINDOW, EVERY)
    assert reading.motion is Motion.WATCHING, reading


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=int(WINDOW / EVERY) + 1, max_value=40), st.integers(1, 60))
def test_a_busy_gpu_over_a_still_host_asks_the_stacks_and_an_io_or_log_rise_is_work(count, cpu):
    busy = Step(ticks=(cpu,), io=(0,), log=0, gpu=100)
    assert read_progress(record([busy] * count), WINDOW, EVERY).motion is Motion.GPU_SPIN
    writes = Step(ticks=(cpu,), io=(0,), log=10, gpu=100)
    assert read_progress(record([busy] * count + [writes]), WINDOW, EVERY).motion is Motion.WORKING
    assert GPU_BUSY_PERCENT <= 100


def test_a_flat_tree_waiting_on_a_lock_held_outside_it_is_blocked_naming_the_holder_and_inside_it_a_hang():
    samples = record([quiet_step(1)] * 20)
    outside = [s.model_copy(update={"lock_waits": [LockWait(waiter_pid=100, holder_pid=999, holder_comm="backup")]}) for s in samples]
    reading = read_progress(outside, WINDOW, EVERY)
    assert reading.motion is Motion.BLOCKED and reading.pids == (999,)
    assert any("held by PID 999 (backup)" in line for line in reading.evidence)
    inside = [s.model_copy(update={"lock_waits": [LockWait(waiter_pid=100, holder_pid=100)]}) for s in samples]
    assert read_progress(inside, WINDOW, EVERY).motion is Motion.FLAT  # a lock the tree holds itself: its own deadlock


def test_a_process_in_uninterruptible_sleep_all_window_long_is_blocked_but_a_moment_of_it_is_not():
    samples = record([quiet_step(1)] * 20)
    d_all = [
        s.model_copy(update={"processes": [p.model_copy(update={"state": "D", "wchan": "nfs_wait"}) for p in s.processes]}) for s in samples
    ]
    assert read_progress(d_all, WINDOW, EVERY).motion is Motion.BLOCKED
    d_last = [*samples[:-1], d_all[-1]]
    assert read_progress(d_last, WINDOW, EVERY).motion is Motion.FLAT


def test_a_record_whose_recorder_stopped_says_so_and_leaves_the_judgement_to_the_polls():
    samples = record([quiet_step(1)] * 20)
    late = samples[-1].model_copy(update={"at_epoch": samples[-1].at_epoch + 120})
    reading = read_progress([*samples[:-1], late], WINDOW, EVERY)
    assert reading.motion is Motion.NO_RECORD
    assert "stopped" in reading.evidence[0]


GPU = Path(__file__).parent / "fixtures" / "logs" / "gpu"


def test_the_captured_h100_spinning_kernel_is_a_gpu_spin_whose_stack_waits_in_synchronize():
    # A real record (tests/fixtures/logs/gpu/PROVENANCE.md): one host thread spinning in synchronize (its CPU rises a core
    # a second), its GPU at 100 %, no I/O, no log. The CPU alone would say work; the GPU's spin over a still host asks
    # the stacks, and the captured stack waits.
    samples = parse_progress((GPU / "hang_spin_progress.txt").read_text().splitlines())
    assert read_progress(samples, 20.0, 1.0).motion is Motion.GPU_SPIN
    waiting, place = stack_sample((GPU / "hang_spin_stacks.txt").read_text())
    assert waiting and "synchronize" in place
    # The same record cut at its last step line (the log's last growth): work, never a spin.
    last_step = max(i for i in range(1, len(samples)) if samples[i].log_size_bytes != samples[i - 1].log_size_bytes)
    assert read_progress(samples[: last_step + 1], 5.0, 1.0).motion is Motion.WORKING
