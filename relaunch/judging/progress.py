"""What a live run's processes did over its stall window, read from its progress record: pure, no I/O.

The recorder beside the trainer (relaunch/host/recorder.sh) samples the whole tree every few seconds: each process's
state, wchan, CPU ticks and I/O bytes, the locks it waits on, the log's size and the GPUs. An expert at the host reads
that record the way this module does, one named rule after another, the first that speaks deciding:

- **paused**: a process of the tree is stopped by a signal (state T: SIGSTOP, Ctrl-Z, a debugger). A person's act:
  never stopped, never relaunched.
- **no record**: none, or one that stopped: the caller judges from the polls' journal, as before the record.
- **GPU spin**: the tree's GPUs busy at every sample of the window while nothing but CPU moves on the host (no I/O,
  no log, no process born or ended): the shape of an NCCL hang (a kernel spins, the host thread spins with it), or of
  one long kernel. Only the stacks tell which; the caller samples them.
- **working**: a counter rose anywhere in the tree within the window: CPU (one long native call), I/O (a child doing
  the data refill), the log, a process born or ended, a GPU busy. Never a stall, whatever its stacks say.
- **watching**: nothing rose, but the record does not span the window yet: never judged on one look.
- **blocked**: nothing rose, and the tree waits on something alive outside it (a file lock another process holds, a
  device or mount in the kernel: state D the whole window). Escalated, never killed: a restart would wait the same.
- **flat**: no step, no write, no CPU, no I/O and no GPU activity in the whole tree for the window: a hang.

Each rule's floors (IDLE_CORES, IO_IDLE_BYTES_PER_SECOND) are what a heartbeat thread or a launcher's monitor costs: a
counter below them is no work. Changes between samples decide, never one sample: a thinned record keeps every rise
(counters only grow) and the samples nearest now whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from relaunch.judging.activity import IDLE_CORES, TICKS_PER_SECOND
from relaunch.judging.snapshot import ProgressSample

# I/O below this rate, averaged between two samples, is no work: a heartbeat's write, a monitor reading /proc. torchrun's
# agent beside a rank hung in a collective read and wrote about 7 KiB/s (tests/test_gang.py, two hosts); a DataLoader or
# a child refilling data moves megabytes.
IO_IDLE_BYTES_PER_SECOND = 32768.0
# A GPU at or above this utilisation in a sample is busy (nvidia-smi's share of time a kernel ran).
GPU_BUSY_PERCENT = 50
# The recorder's newest sample older than this many sample intervals (and STALE_FLOOR_SECONDS) means it stopped.
STALE_FACTOR = 3.0
STALE_FLOOR_SECONDS = 10.0


class Motion(str, Enum):
    """What the record says of the window; each member is one rule below."""

    PAUSED = "paused"
    NO_RECORD = "no_record"
    GPU_SPIN = "gpu_spin"
    WORKING = "working"
    WATCHING = "watching"
    BLOCKED = "blocked"
    FLAT = "flat"

    def is_quiet(self) -> bool:
        """Nothing the tree does is work: a stall, unless it is still being watched."""
        return self in (Motion.BLOCKED, Motion.FLAT, Motion.GPU_SPIN)


@dataclass(frozen=True)
class Rise:
    """What rose between two samples."""

    at_epoch: float  # the later sample's time
    cpu_cores: float
    io_bytes_per_second: float
    log_bytes: int
    processes: tuple[str, ...]  # born or ended, as `PID (comm)`
    gpu_percent: int  # the busiest of the tree's GPUs in the later sample (-1: not read)

    def host(self) -> bool:
        """A rise of the host's own counters, other than CPU: I/O, the log, the tree's processes."""
        return self.io_bytes_per_second >= IO_IDLE_BYTES_PER_SECOND or self.log_bytes > 0 or bool(self.processes)

    def any(self) -> bool:
        return self.host() or self.cpu_cores >= IDLE_CORES or self.gpu_percent > 0

    def what(self) -> str:
        parts = []
        if self.cpu_cores >= IDLE_CORES:
            parts.append(f"{self.cpu_cores:.2f} cores of CPU")
        if self.io_bytes_per_second >= IO_IDLE_BYTES_PER_SECOND:
            parts.append(f"{self.io_bytes_per_second / 1024:.0f} KiB/s of I/O")
        if self.log_bytes > 0:
            parts.append(f"{self.log_bytes} bytes of log")
        if self.processes:
            parts.append("processes born or ended: " + ", ".join(self.processes[:4]))
        if self.gpu_percent > 0:
            parts.append(f"a GPU at {self.gpu_percent} %")
        return "; ".join(parts)


@dataclass(frozen=True)
class Reading:
    """The record's verdict on the window, with the facts a person reads."""

    motion: Motion
    evidence: tuple[str, ...]
    spans_seconds: float = 0.0  # how far back the record reaches from its newest sample
    quiet_seconds: float = 0.0  # since anything last rose in the tree (the whole span where nothing did)
    pids: tuple[int, ...] = ()  # who the rule names: the paused processes, a lock's holder, the processes in D


@dataclass(frozen=True)
class Record:
    """A record prepared for the rules: its samples, the window, and what rose between each pair of samples."""

    samples: Sequence[ProgressSample]
    window_seconds: float
    sample_seconds: float
    gpu_indexes: frozenset[int] | None
    rises: tuple[Rise, ...] = field(default=())
    host_now_epoch: float | None = None  # the host's clock at the look, where its newest sample is not of that moment

    @property
    def now(self) -> float:
        return self.samples[-1].at_epoch

    @property
    def spans(self) -> float:
        return self.now - self.samples[0].at_epoch

    def in_window(self) -> list[ProgressSample]:
        """The samples of the window, and the one just before it (the changes over the window start there)."""
        start = self.now - self.window_seconds
        before = [s for s in self.samples if s.at_epoch <= start]
        return [*before[-1:], *(s for s in self.samples if s.at_epoch > start)]

    def last_rise(self, host_only: bool = False) -> Rise | None:
        return next((r for r in reversed(self.rises) if (r.host() if host_only else r.any())), None)

    def quiet_seconds(self) -> float:
        rise = self.last_rise()
        return self.now - (rise.at_epoch if rise else self.samples[0].at_epoch)


def read_progress(
    samples: Sequence[ProgressSample],
    window_seconds: float,
    sample_seconds: float,
    gpu_indexes: Sequence[int] | None = None,
    host_now_epoch: float | None = None,
) -> Reading:
    """The first rule that speaks (RULES, in order); `samples` oldest first, the newest the poll's own moment (a health
    poll's), or the recorder's last (a watch look's, which says the host's clock `host_now_epoch` beside it)."""
    indexes = frozenset(gpu_indexes) if gpu_indexes is not None else None
    gpus = [_tree_gpu_percent(b, indexes) for b in samples[1:]]
    record = Record(
        samples=samples,
        window_seconds=window_seconds,
        sample_seconds=sample_seconds,
        gpu_indexes=indexes,
        rises=tuple(_rise(a, b, g) for a, b, g in zip(samples, samples[1:], gpus)),
        host_now_epoch=host_now_epoch,
    )
    for rule in RULES:
        reading = rule(record)
        if reading is not None:
            return reading
    raise AssertionError("the last rule always speaks")  # pragma: no cover


def paused(record: Record) -> Reading | None:
    """A process of the tree stopped by a signal (T) at the newest sample: a person's pause, never a stall."""
    if not record.samples:
        return None
    latest = record.samples[-1]
    held = [p for p in latest.processes if p.state == "T"]
    if not held:
        return None
    since = latest.at_epoch
    for sample in reversed(record.samples[:-1]):
        if not any(p.state == "T" and p.pid == held[0].pid for p in sample.processes):
            break
        since = sample.at_epoch
    names = ", ".join(f"PID {p.pid} ({p.comm})" for p in held[:6])
    pids = " ".join(str(p.pid) for p in held)
    return Reading(
        motion=Motion.PAUSED,
        evidence=(
            f"stopped by a signal (state T: SIGSTOP, Ctrl-Z or a debugger) for {latest.at_epoch - since:.0f} s or more: {names}",
            f"a person's pause: nothing is stopped or relaunched; `kill -CONT {pids}` resumes it",
        ),
        spans_seconds=record.spans,
        pids=tuple(p.pid for p in held),
    )


def no_record(record: Record) -> Reading | None:
    """No record to judge from, or one whose recorder stopped: the caller judges from its polls."""
    if len(record.samples) < 2:
        return Reading(motion=Motion.NO_RECORD, evidence=("no progress record of this run yet: judged from the polls' own history",))
    newest = record.samples[-1].at_epoch
    gap = newest - record.samples[-2].at_epoch
    if record.host_now_epoch is not None:
        gap = max(gap, record.host_now_epoch - newest)
    if gap > max(STALE_FACTOR * record.sample_seconds, STALE_FLOOR_SECONDS):
        return Reading(
            motion=Motion.NO_RECORD,
            evidence=(f"the progress record stopped {gap:.0f} s ago (its recorder is restarted): judged from the polls' own history",),
        )
    return None


def gpu_spin(record: Record) -> Reading | None:
    """The tree's GPUs busy at every sample of a window the record spans, and nothing on the host but CPU moving."""
    if record.spans < record.window_seconds:
        return None
    window = record.in_window()
    busy = [_tree_gpu_percent(s, record.gpu_indexes) for s in window[1:]]
    read = [g for g in busy if g >= 0]
    if len(read) < 2 or min(read) < GPU_BUSY_PERCENT:
        return None
    start = window[0].at_epoch
    if any(r.host() for r in record.rises if r.at_epoch > start):
        return None
    return Reading(
        motion=Motion.GPU_SPIN,
        evidence=(
            f"its GPUs busy ({min(read)}-{max(read)} %) at all {len(read)} samples of the last {record.now - start:.0f} s while "
            "its tree did no I/O, wrote no log and started no process: a kernel that spins (an NCCL hang), or one long kernel",
        ),
        spans_seconds=record.spans,
        quiet_seconds=record.now - start,
    )


def working(record: Record) -> Reading | None:
    """A counter rose within the window: work, never a stall."""
    rise = record.last_rise()
    if rise is None or record.now - rise.at_epoch >= record.window_seconds:
        return None
    return Reading(
        motion=Motion.WORKING,
        evidence=(f"its tree works: {rise.what()} {record.now - rise.at_epoch:.0f} s ago",),
        spans_seconds=record.spans,
        quiet_seconds=record.now - rise.at_epoch,
    )


def watching(record: Record) -> Reading | None:
    """Nothing rose over a record shorter than the window: watched on, never judged on one look."""
    if record.spans >= record.window_seconds:
        return None
    return Reading(
        motion=Motion.WATCHING,
        evidence=(f"nothing in its tree rose over the {record.spans:.0f} s recorded, of a {record.window_seconds:.0f} s stall window",),
        spans_seconds=record.spans,
        quiet_seconds=record.spans,
    )


def blocked(record: Record) -> Reading | None:
    """Flat, and waiting on something alive outside the tree: a file lock's holder, or the kernel (D) all window long."""
    latest = record.samples[-1]
    window = record.in_window()
    tree = {p.pid for p in latest.processes}
    # The newest sample of the window that read the lock table (it is read only when a wchan shows a lock wait: a sample
    # taken as the waiter was scheduled for a moment has none; a loaded host made that the last one).
    seen = [s for s in window if s.lock_waits]
    waits = {(w.waiter_pid, w.holder_pid, w.holder_comm) for s in seen[-1:] for w in s.lock_waits if w.holder_pid not in tree}
    if waits:
        lines = tuple(f"PID {w} waits on a file lock held by PID {h} ({c or '?'}), alive and not of its tree" for w, h, c in sorted(waits))
        return Reading(
            motion=Motion.BLOCKED,
            evidence=(*lines, "a restart would wait the same: end or free the holder, nothing is stopped here"),
            spans_seconds=record.spans,
            quiet_seconds=record.quiet_seconds(),
            pids=tuple(sorted({h for _, h, _ in waits})),
        )
    stuck = [p for p in latest.processes if p.state == "D" and all(_state_of(s, p.pid) == "D" for s in window)]
    if stuck:
        return Reading(
            motion=Motion.BLOCKED,
            evidence=(
                *(f"PID {p.pid} ({p.comm}) in uninterruptible sleep (D) all window long, in the kernel at {p.wchan}" for p in stuck[:6]),
                "a device or a mount does not answer (a network filesystem, a GPU driver): nothing is stopped here",
            ),
            spans_seconds=record.spans,
            quiet_seconds=record.quiet_seconds(),
            pids=tuple(p.pid for p in stuck),
        )
    return None


def flat(record: Record) -> Reading:
    """Nothing rose in the whole tree for the window: a hang."""
    latest = record.samples[-1]
    where = ", ".join(f"PID {p.pid} ({p.comm}) {p.state} in {p.wchan}" for p in latest.processes[:6])
    quiet = record.quiet_seconds()
    return Reading(
        motion=Motion.FLAT,
        evidence=(
            f"no step, no write, no CPU, no I/O and no GPU activity in its whole tree for {quiet:.0f} s "
            f"(stall window {record.window_seconds:.0f} s, {len(record.in_window())} samples)",
            *([f"where its processes wait: {where}"] if where else []),
        ),
        spans_seconds=record.spans,
        quiet_seconds=quiet,
    )


# In order: the first that speaks decides. A pause is a person's whatever else the record says; a record that is not
# there decides nothing; a busy GPU over a still host needs the stacks before anything else is said.
RULES: tuple[Callable[[Record], Reading | None], ...] = (paused, no_record, gpu_spin, working, watching, blocked, flat)


def _state_of(sample: ProgressSample, pid: int) -> str | None:
    return next((p.state for p in sample.processes if p.pid == pid), None)


def _tree_gpu_percent(sample: ProgressSample, indexes: frozenset[int] | None) -> int:
    """The busiest of the tree's GPUs: those its processes hold memory on; with no such line (a container numbering
    PIDs its own way), the target's GPUs, else every GPU. -1: the sample read no GPU."""
    if not sample.gpus:
        return -1
    buses = set(sample.gpu_app_buses.values())
    ours = [g for g in sample.gpus if g.bus_id and g.bus_id in buses]
    if not ours:
        ours = [g for g in sample.gpus if indexes is None or g.index in indexes]
    return max((g.utilization_percent for g in ours), default=-1)


def _rise(a: ProgressSample, b: ProgressSample, gpu_percent: int) -> Rise:
    span = max(b.at_epoch - a.at_epoch, 1e-3)
    before = {p.pid: p for p in a.processes}
    after = {p.pid: p for p in b.processes}
    ticks = sum(max(0, p.cpu_ticks - before[p.pid].cpu_ticks) for p in after.values() if p.pid in before)
    io = sum(max(0, p.io_bytes - before[p.pid].io_bytes) for p in after.values() if p.pid in before)
    changed = [f"PID {p.pid} ({p.comm}) born" for pid, p in after.items() if pid not in before]
    changed += [f"PID {p.pid} ({p.comm}) ended" for pid, p in before.items() if pid not in after]
    # A sample that read no process (the tree gone between reads) is no birth or end of every process.
    if not a.processes or not b.processes:
        changed = []
    return Rise(
        at_epoch=b.at_epoch,
        cpu_cores=ticks / TICKS_PER_SECOND / span,
        io_bytes_per_second=io / span,
        log_bytes=abs(b.log_size_bytes - a.log_size_bytes),  # a log that shrank was rewritten (copytruncate): a write
        processes=tuple(changed),
        gpu_percent=gpu_percent,
    )
