"""Pure judgement: from snapshots to a verdict, a cause, evidence and metrics. No I/O here."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from relaunch.config import Thresholds
from relaunch.hardware import disk_full_evidence, full_disk_evidence, gpu_fault_evidence
from relaunch.snapshot import HealthSnapshot
from relaunch.torchrun import RankFailure, collective_timeouts, rendezvous_gap, root_cause, worker_group_failures
from relaunch.verdicts import (
    CACHE_DAMAGE_WARNING,
    DATALOADER_WORKER_DIED,
    DEFAULT_LOSS,
    EXCEPTION_LINE,
    KERNEL_OOM,
    LOAD_ERROR_DETAIL,
    MODULE_TO_PACKAGE,
    NATIVE_SIGNALS,
    NOT_A_TRAINING_STEP,
    NOT_TRAINING_PROGRESS,
    REFINEMENTS,
    SIGNAL_NAMES,
    SIGNATURES,
    SLOWDOWN_WARNINGS,
    TQDM_PROGRESS,
    WRAPPER_EXCEPTIONS,
    Cause,
    Verdict,
)

DEFAULT_THROUGHPUT = re.compile(
    # `21.3Ktok/s`, `21500 tok/s`, `1.5M tokens/s`, `900 tok/sec`; or a key first: `tokens_per_sec: 2660`, `tok/s=21300`.
    r"(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[kKmM])?\s*(?:tok(?:en)?s?)\s*/\s*s(?:ec)?\b"
    r"|(?<![A-Za-z])(?:tok(?:en)?s?)(?:[ _]?per[ _]?|\s*/\s*)s(?:ec(?:ond)?)?(?P<keyscope>(?:[ _/-](?:per[ _-]?)?(?:gpu|device|dev|rank))?)['\"]?\s*[=:]\s*(?P<value2>\d+(?:\.\d+)?)(?P<unit2>[kKmM](?![A-Za-z]))?",
    re.IGNORECASE,
)
UNIT = {"k": 1e3, "m": 1e6}
# Words beside a throughput figure that say whose it is: one GPU's (`2660 tok/s/gpu`, `tokens/s per device`,
# `per_gpu_tok/s`) or the whole job's (`21.3Ktok/s total`, `total tok/s`, `global throughput: ...`).
PER_DEVICE_AFTER = re.compile(
    r"^\s*(?:/|_|-|\s)\s*(?:per[\s_-]?)?(?:gpu|device|dev|rank|card|chip)s?\b|^[\s_]*\(?per[\s_-]?(?:gpu|device|rank)", re.I
)
PER_DEVICE_BEFORE = re.compile(r"(?:\bper[\s_-]?(?:gpu|device|dev|rank)|\b(?:gpu|device|rank)\s*\d*)[\s_:=-]*\w*[\s_:=-]*$", re.I)
TOTAL_AFTER = re.compile(r"^\s*[(\[]?\s*(?:total|global|overall|aggregate|all[\s_-]gpus|cluster)\b", re.I)
TOTAL_BEFORE = re.compile(r"\b(?:total|global|overall|aggregate|cluster|all[\s_-]gpus)\b[^|,;]*$", re.I)
# What the default step pattern is: tqdm's progress counts as steps only under it (a pattern a user gave says
# exactly which lines are steps).
DEFAULT_STEP_PATTERN = Thresholds.model_fields["step_pattern"].default


class Metrics(BaseModel):
    last_step: int | None = Field(None, description="Highest step number in the log.")
    first_nonfinite_step: int | None = Field(None, description="Step of the first step line in the tail whose loss is nan or inf.")
    steps_seen: int = Field(0, description="Step lines in the log tail.")
    tokens_per_second: float | None = Field(None, description="Median of the last three throughput readings.")
    gpu_memory_used_mib: list[int] = Field(default_factory=list)
    gpu_utilization_percent: list[int] = Field(default_factory=list)


class Diagnosis(BaseModel):
    verdict: Verdict
    cause: Cause | None = None
    package: str | None = Field(None, description="For missing_dependency: the distribution to install.")
    summary: str = Field("", description="One line a person reads first.")
    checkpoint: str | None = Field(
        None, description="The checkpoint the attempt was launched with (for broken_checkpoint: the one to skip)."
    )
    disk_still_full: bool = Field(False, description="disk_full and the poll still finds less free space than the minimum.")
    rendezvous_incomplete: bool = Field(
        False, description="distributed_failure where the ranks never all met: a relaunch would wait for the same missing node."
    )
    evidence: list[str] = Field(default_factory=list, description="The log or signal lines that decided.")
    metrics: Metrics = Field(default_factory=Metrics)

    @property
    def settled(self) -> bool:
        return self.verdict is not Verdict.STARTING


@dataclass(frozen=True)
class Progress:
    """What earlier polls of one attempt saw; advanced by `advance`, never by I/O."""

    last_step: int | None = None
    step_changed_at: float | None = None  # seconds since launch when last_step last changed
    # The first step line, where a poll saw it come (a run first seen already stepping leaves both None).
    first_step: int | None = None
    first_step_at: float | None = None  # seconds since launch: the log's last write when a poll first found it
    step_intervals: tuple[float, ...] = ()
    log_size_bytes: int = 0
    log_grew_at: float | None = None
    gpu_memory_mib: int = 0
    gpu_rose_at: float | None = None
    gpu_busy_at: float | None = None
    gpu_all_zero_polls: int = 0
    checkpoint_written_at: float | None = None  # seconds since launch of the newest write into checkpoint_dir seen
    polls: int = 0


@dataclass(frozen=True)
class Reading:
    steps: list[int] = field(default_factory=list)
    throughputs: list[float] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)  # one per step line; None where none is printed


def read_log(lines: list[str], thresholds: Thresholds) -> Reading:
    step_of = step_reader(thresholds)
    tput_re = re.compile(thresholds.throughput_pattern) if thresholds.throughput_pattern else DEFAULT_THROUGHPUT
    loss_re = re.compile(thresholds.loss_pattern, re.IGNORECASE) if thresholds.loss_pattern else DEFAULT_LOSS
    steps: list[int] = []
    tputs: list[float] = []
    losses: list[float | None] = []
    for line in lines:
        found = step_of(line)
        if found is None:
            continue
        step, redraw = found
        if redraw and steps and steps[-1] == step:
            continue  # tqdm redrew the same count (a postfix update, its closing draw): no new step
        steps.append(step)
        loss = loss_re.search(line)
        losses.append(_float_or_none(loss.group("value")) if loss else None)
        tput = throughput(line, tput_re)
        if tput is not None:
            tputs.append(tput)
    return Reading(steps, tputs, losses)


def step_reader(thresholds: Thresholds) -> Callable[[str], tuple[int, bool] | None]:
    """A function from a log line to (its training step, whether it is a tqdm redraw), or None for no step line.

    A resume, checkpoint load or save line is never a training step, whatever the pattern (NOT_A_TRAINING_STEP).
    Under the default pattern a tqdm bar's count is a step too, unless the bar is loading or evaluating."""
    step_re = re.compile(thresholds.step_pattern)
    tqdm = thresholds.step_pattern == DEFAULT_STEP_PATTERN

    def step_of(line: str) -> tuple[int, bool] | None:
        if NOT_A_TRAINING_STEP.search(line):
            return None
        bar = TQDM_PROGRESS.search(line) if tqdm and "[" in line else None
        if bar:
            n = int(bar["n"] or bar["n2"])
            # 0 done is the bar drawn before the first iteration (which may compile for minutes): no step yet.
            if n == 0 or NOT_TRAINING_PROGRESS.search(line[: bar.start()]):  # the bar's description
                return None
            return n, True
        m = step_re.search(line)
        return (int(m.group("step")), False) if m else None

    return step_of


def throughput(line: str, pattern: re.Pattern[str]) -> float | None:
    """Tokens per second on one line: the whole job's figure over one GPU's (`2660 tok/s/gpu | 21.3Ktok/s total`
    reads 21300), a figure of no stated scope over a per-GPU one, the first of its kind otherwise. A line with
    per-GPU figures only reads the per-GPU one, as the baseline set from the same printout does."""
    best: tuple[int, float] | None = None  # (rank: 0 total, 1 unscoped, 2 per device; value)
    for m in pattern.finditer(line):
        groups = m.groupdict()
        text = groups.get("value") or groups.get("value2")
        if text is None:
            continue
        unit = (groups.get("unit") or groups.get("unit2") or "").lower()
        value = float(text) * UNIT.get(unit, 1.0)
        before = re.split(r"[|,;]", line[max(0, m.start() - 40) : m.start()])[-1]
        after = line[m.end() : m.end() + 24]
        if TOTAL_AFTER.search(after) or TOTAL_BEFORE.search(before) or TOTAL_BEFORE.search(m.group(0)):
            rank = 0
        elif groups.get("keyscope") or PER_DEVICE_AFTER.search(after) or PER_DEVICE_BEFORE.search(before):
            rank = 2
        else:
            rank = 1
        if best is None or rank < best[0]:
            best = (rank, value)
    return best[1] if best else None


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def first_nonfinite(reading: Reading) -> int | None:
    return next((step for step, loss in zip(reading.steps, reading.losses) if loss is not None and not math.isfinite(loss)), None)


def diverged(reading: Reading, n: int) -> bool:
    last = reading.losses[-n:]
    return len(last) == n and all(loss is not None and not math.isfinite(loss) for loss in last)


def advance(progress: Progress, snap: HealthSnapshot, thresholds: Thresholds) -> Progress:
    """Fold one snapshot into the attempt's progress."""
    now = snap.seconds_since_launch or 0.0
    reading = read_log(snap.log_tail, thresholds)
    p = replace(progress, polls=progress.polls + 1)
    if progress.polls == 0:
        # First sight of a run under way: its last line is as old as the log's last write.
        seen_at = now - (snap.seconds_since_log_write or 0.0)
        p = replace(p, log_size_bytes=snap.log_size_bytes, log_grew_at=seen_at)
        if reading.steps:  # the last step line is at least as old as the last write
            p = replace(p, last_step=reading.steps[-1], step_changed_at=seen_at)
    if reading.steps and p.last_step is None and progress.polls > 0:
        p = replace(p, first_step=reading.steps[0], first_step_at=now - (snap.seconds_since_log_write or 0.0))
    if reading.steps and reading.steps[-1] != p.last_step:
        intervals = p.step_intervals
        if p.last_step is not None and p.step_changed_at is not None and reading.steps[-1] > p.last_step:
            per_step = (now - p.step_changed_at) / (reading.steps[-1] - p.last_step)
            intervals = (*intervals, per_step)[-20:]
        p = replace(p, last_step=reading.steps[-1], step_changed_at=now, step_intervals=intervals)
    if snap.log_size_bytes > p.log_size_bytes:
        p = replace(p, log_size_bytes=snap.log_size_bytes, log_grew_at=now)
    used = sum(g.memory_used_mib for g in snap.gpus)
    if used > p.gpu_memory_mib:
        p = replace(p, gpu_memory_mib=used, gpu_rose_at=now)
    if any(g.utilization_percent > 0 for g in snap.gpus):
        p = replace(p, gpu_busy_at=now)
    written = checkpoint_written_at(snap)
    if written is not None and (p.checkpoint_written_at is None or written > p.checkpoint_written_at):
        p = replace(p, checkpoint_written_at=written)
    all_zero = bool(snap.gpus) and all(g.memory_used_mib == 0 for g in snap.gpus)
    return replace(p, gpu_all_zero_polls=p.gpu_all_zero_polls + 1 if all_zero else 0)


def checkpoint_written_at(snap: HealthSnapshot) -> float | None:
    """When checkpoint_dir was last written, in seconds since launch; None where the poll cannot tell.

    The snapshot's times are the host's: its clock now is the log's mtime plus the seconds since that write."""
    if snap.checkpoint_mtime_epoch is None or snap.log_mtime_epoch is None or snap.seconds_since_log_write is None:
        return None
    host_now = snap.log_mtime_epoch + snap.seconds_since_log_write
    age = max(0.0, host_now - snap.checkpoint_mtime_epoch)  # a write after the clock was read is a write now
    return (snap.seconds_since_launch or 0.0) - age


def stall_window_seconds(progress: Progress, thresholds: Thresholds) -> float:
    """The floor, or a multiple of the observed step interval when that is longer."""
    if not progress.step_intervals:
        return thresholds.stall_window_floor_seconds
    typical = statistics.median(progress.step_intervals)
    return max(thresholds.stall_window_floor_seconds, thresholds.stall_interval_factor * typical)


def diagnose(
    snap: HealthSnapshot,
    thresholds: Thresholds,
    progress: Progress | None = None,
    min_free_disk_gb: float = 0.0,
    gpu_indexes: list[int] | None = None,
) -> Diagnosis:
    """The verdict for one snapshot, given what earlier polls of the same attempt saw.

    gpu_indexes: the target's GPUs (from CUDA_VISIBLE_DEVICES); None: all the host's GPUs are the target's. Kernel
    lines and counters about other GPUs are another job's. min_free_disk_gb: below it a disk the trainer filled is
    still full (no relaunch onto it)."""
    progress = progress or advance(Progress(), snap, thresholds)
    metrics = _metrics(snap, thresholds)
    settled = _unmanaged_or_stopped(snap, metrics)
    if settled is not None:
        return settled
    if not snap.launched and not snap.session_alive and snap.exit_code is None:
        return Diagnosis(
            verdict=Verdict.UNKNOWN, summary="no trainer on record", evidence=["no launch recorded and no tmux session"], metrics=metrics
        )
    if snap.exit_code is not None or not snap.pid_alive:
        return _gpu_fault(snap, thresholds, metrics, gpu_indexes) or _gone(snap, metrics, min_free_disk_gb)
    return _alive(snap, thresholds, progress, metrics, gpu_indexes)


# ---- what relaunch does not judge: the session holds another run, or a person stopped it ------------------


def _unmanaged_or_stopped(snap: HealthSnapshot, metrics: Metrics) -> Diagnosis | None:
    """Decided before anything else: none of these may lead to a stop, a signal or a relaunch."""
    if snap.foreign:
        held = ", ".join(_foreign_name(line) for line in snap.foreign)
        if snap.pid_alive:
            summary = (
                f"relaunch's trainer PID {snap.pid} runs outside the target's session while the session holds {held}: "
                "two trainers of one target; nothing stopped"
            )
            evidence = [
                *[f"in the session: {line}" for line in snap.foreign],
                f"relaunch's trainer: PID {snap.pid}, alive",
                "both may write the same checkpoints: end the one that should not run yourself, then `relaunch check` again",
            ]
            return Diagnosis(verdict=Verdict.UNMANAGED, cause=Cause.TWO_TRAINERS, summary=summary, evidence=evidence, metrics=metrics)
        if snap.foreign_log is None:
            summary = f"the target's session holds {held}, not a training run: nothing stopped"
            evidence = [
                *[f"in the session: {line}" for line in snap.foreign],
                "no log it writes was found (no `tee` argument, its stdout is no file)",
                "if it is the trainer, name its log: `relaunch adopt TARGET --log PATH`; "
                "if not, end it or rename the session, then `relaunch recover TARGET`",
            ]
            return Diagnosis(verdict=Verdict.UNMANAGED, cause=Cause.NOT_A_TRAINER, summary=summary, evidence=evidence, metrics=metrics)
        summary = f"the target's session holds a run relaunch did not start, writing {snap.foreign_log}: adopt it (relaunch adopt TARGET)"
        evidence = [*[f"in the session: {line}" for line in snap.foreign], f"its log: {snap.foreign_log}"]
        return Diagnosis(verdict=Verdict.UNMANAGED, summary=summary, evidence=evidence, metrics=metrics)
    if snap.stopped_at is not None and not snap.pid_alive:
        when = datetime.fromtimestamp(snap.stopped_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return Diagnosis(
            verdict=Verdict.STOPPED,
            summary=f"stopped on purpose (relaunch stop) at {when}; relaunch recover starts it again",
            evidence=[f"stopped at {when} by `relaunch stop`; no trainer runs", *_last_lines(snap, 1)],
            metrics=metrics,
        )
    return None


def _foreign_name(line: str) -> str:
    """`123 htop -d 5` as a person reads it: `htop -d 5` (pid 123)."""
    pid, _, command = line.strip().partition(" ")
    return f"`{command.strip()}` (pid {pid})" if pid.isdigit() and command.strip() else f"`{line.strip()}`"


def _gpu_fault(snap: HealthSnapshot, t: Thresholds, metrics: Metrics, gpu_indexes: list[int] | None) -> Diagnosis | None:
    """A failed GPU of the target outranks whatever the trainer printed: its errors are the failure's knock-on."""
    gpu = gpu_fault_evidence(snap, t.expected_gpus, gpu_indexes)
    if gpu:
        return Diagnosis(
            verdict=Verdict.CRASHED, cause=Cause.GPU_FAULT, summary=gpu[0], evidence=[*gpu, *_kernel_note(snap)], metrics=metrics
        )
    return None


def _kernel_note(snap: HealthSnapshot) -> list[str]:
    return (
        ["the kernel log is not readable here (a container?): judged from nvidia-smi and the trainer's own lines"]
        if snap.kernel_readable is False
        else []
    )


def _metrics(snap: HealthSnapshot, thresholds: Thresholds) -> Metrics:
    reading = read_log(snap.log_tail, thresholds)
    recent = reading.throughputs[-3:]
    return Metrics(
        last_step=max(reading.steps) if reading.steps else None,
        first_nonfinite_step=first_nonfinite(reading),
        steps_seen=len(reading.steps),
        tokens_per_second=statistics.median(recent) if recent else None,
        gpu_memory_used_mib=[g.memory_used_mib for g in snap.gpus],
        gpu_utilization_percent=[g.utilization_percent for g in snap.gpus],
    )


# ---- the trainer is gone ---------------------------------------------------------------------


def _gone(snap: HealthSnapshot, metrics: Metrics, min_free_disk_gb: float = 0.0) -> Diagnosis:
    code = snap.exit_code
    if code == 0:
        return Diagnosis(verdict=Verdict.FINISHED, summary="the trainer exited 0", evidence=_last_lines(snap, 3), metrics=metrics)
    cause = classify_failure([*snap.log_matches, *snap.log_tail])
    # A DataLoader worker the trainer says died of a signal is of its tree even where no poll saw it (it lived seconds).
    workers = (
        {int(pid) for line in cause[2] if (m := DATALOADER_WORKER_DIED.search(line)) for pid in re.findall(r"\d+", m["pids"])}
        if cause
        else set()
    )
    oom_kernel = _kernel_oom_lines(snap, workers)
    exit_text = (
        f"exit code {code}"
        if code is not None
        else "no exit code: an adopted run's exit code cannot be known (relaunch did not start it)"
        if snap.adopted
        else "no exit code recorded"
    )
    if cause is not None and cause[0] in (Cause.BROKEN_CHECKPOINT, Cause.CHECKPOINT_INCOMPATIBLE) and metrics.steps_seen:
        # It stepped, so the checkpoint it was given loaded: the load error is about something else.
        cause = (Cause.ERROR, None, cause[2])
    rank = root_cause(snap.log_tail)
    if rank and (cause is None or (cause[0] is Cause.ERROR and WRAPPER_EXCEPTIONS.search(cause[2][-1]))):
        # torchrun's wrapper error says nothing; the rank that failed first does.
        return _rank_failure(rank, snap, metrics, exit_text)
    if cause is not None and not (oom_kernel and (cause[0] is Cause.ERROR or workers)):
        kind, package, decisive = cause
        gap = None
        summary = f"{kind.value}: {decisive[-1].strip()}" if decisive else kind.value
        lines = [*snap.log_matches, *snap.log_tail]
        if kind is Cause.DISTRIBUTED_FAILURE:
            gap = rendezvous_gap(lines)
            restarts = worker_group_failures(lines)
            decisive = [*decisive, *collective_timeouts(lines)]
            decisive += [rank.describe()] if rank else []
            decisive += [gap] if gap else []
            if len(restarts) > 1:
                # torchrun's group failed, restarted, and failed again: each failure is evidence of the restarts spent.
                decisive += restarts
                summary = f"torchrun restarted its worker group {len(restarts) - 1} time(s) and it failed again: {summary}"
            summary = gap or summary
        if kind is Cause.CHECKPOINT_INCOMPATIBLE:
            # What did not fit, as torch says it: the refused global, the missing keys, the first shape mismatch.
            detail = [line.strip() for line in lines if LOAD_ERROR_DETAIL.match(line)][:3]
            decisive += detail
            summary = f"{kind.value}: {detail[0]}" if detail else summary
        if package:
            summary = f"missing_dependency: install {package}"
        extra = (
            _checkpoint_note(snap)
            if kind in (Cause.BROKEN_CHECKPOINT, Cause.CHECKPOINT_INCOMPATIBLE)
            else _shm_note(snap)
            if kind in (Cause.NATIVE_CRASH, Cause.DISK_FULL)
            else []
        )
        extra += _kernel_note(snap) if kind is Cause.GPU_FAULT else []
        # A full /dev/shm does not empty itself on a relaunch: a person must give the container more.
        shm_full = kind is Cause.DISK_FULL and any("shared memory" in line for line in decisive)
        # The trainer said its disk filled: the poll's figures say whether it still is (no relaunch onto it).
        low = disk_full_evidence(snap, min_free_disk_gb) if kind is Cause.DISK_FULL else []
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=kind,
            package=package,
            summary=low[0] if low else summary,
            evidence=[*low, *decisive, *extra, exit_text],
            metrics=metrics,
            checkpoint=snap.checkpoint,
            disk_still_full=shm_full or bool(low),
            rendezvous_incomplete=gap is not None,
        )
    if oom_kernel or (code == 137 and any("Killed" == line.strip() for line in snap.log_tail[-3:])):
        said = cause[2] if cause and workers else []  # the trainer's own word that its worker died
        evidence = [*oom_kernel, *said, exit_text] if oom_kernel else [*_last_lines(snap, 2), exit_text]
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=Cause.HOST_OOM_KILLED,
            summary="killed by the kernel's OOM killer",
            evidence=evidence,
            metrics=metrics,
        )
    if code is not None and code - 128 in NATIVE_SIGNALS:
        name = SIGNAL_NAMES[code - 128]
        damaged = [line.strip() for line in [*snap.log_matches, *snap.log_tail] if CACHE_DAMAGE_WARNING.search(line)][:1]
        if damaged and not metrics.steps_seen:
            # Inductor found its cache damaged, then the process died of its own signal before a step: loading that cache.
            evidence = [*damaged, f"{exit_text} ({name}) before the first step, after the compile cache was found damaged"]
            summary = f"died of {name} loading a damaged compile cache"
            return Diagnosis(verdict=Verdict.CRASHED, cause=Cause.CORRUPT_CACHE, summary=summary, evidence=evidence, metrics=metrics)
        evidence = [*_last_lines(snap, 2), *_shm_note(snap), f"{exit_text} ({name}, raised by the trainer's own native code)"]
        return Diagnosis(verdict=Verdict.CRASHED, cause=Cause.NATIVE_CRASH, summary=f"died of {name}", evidence=evidence, metrics=metrics)
    if code is not None and code > 128:
        # A signal from outside (SIGKILL, SIGTERM) explains the death whatever the disk's free space.
        name = SIGNAL_NAMES.get(code - 128, f"signal {code - 128}")
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=Cause.KILLED,
            summary=f"killed by {name}",
            evidence=[*_last_lines(snap, 2), f"{exit_text} ({name})", *_others_oom(snap)],
            metrics=metrics,
        )
    full = full_disk_evidence(snap)
    if full:
        # Nothing else explains the death and the disk is really full: the trainer's own words (a traceback, its
        # exit code) may be what could not be written.
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=Cause.DISK_FULL,
            summary=full[0],
            evidence=[*full, "the trainer's log names no other cause of its death", exit_text, *_last_lines(snap, 2)],
            metrics=metrics,
            disk_still_full=True,
        )
    if code is None:
        evidence = [_session_line(snap), "trainer PID not alive", exit_text, *_last_lines(snap, 2), *_others_oom(snap)]
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=Cause.SILENT_EXIT,
            summary="the trainer vanished without an exit code or traceback",
            evidence=evidence,
            metrics=metrics,
        )
    return Diagnosis(
        verdict=Verdict.CRASHED,
        cause=Cause.ERROR,
        summary=f"exited {code} without a traceback",
        evidence=[*_last_lines(snap, 3), exit_text],
        metrics=metrics,
    )


def _rank_failure(rank: RankFailure, snap: HealthSnapshot, metrics: Metrics, exit_text: str) -> Diagnosis:
    signal = rank.signal_number
    cause = Cause.NATIVE_CRASH if signal in NATIVE_SIGNALS else Cause.KILLED if signal else Cause.ERROR
    summary = rank.describe()
    failures = worker_group_failures([*snap.log_matches, *snap.log_tail])
    if len(failures) > 1:
        # torchrun restarted its worker group and lost a rank again: the group cannot hold together; all ranks are
        # relaunched as one (the restarts torchrun allows are spent).
        summary = f"torchrun restarted its worker group {len(failures) - 1} time(s) and it failed again: {summary}"
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=Cause.DISTRIBUTED_FAILURE,
            summary=summary,
            evidence=[summary, *failures, f"launcher: {exit_text}"],
            metrics=metrics,
        )
    return Diagnosis(verdict=Verdict.CRASHED, cause=cause, summary=summary, evidence=[summary, f"launcher: {exit_text}"], metrics=metrics)


def _checkpoint_note(snap: HealthSnapshot) -> list[str]:
    return [f"the checkpoint it was given: {snap.checkpoint}"] if snap.checkpoint else []


SMALL_SHM_BYTES = 1 << 30


def _shm_note(snap: HealthSnapshot) -> list[str]:
    shm = next((d for d in snap.disks if d.path == "/dev/shm"), None)
    if shm and shm.size_bytes < SMALL_SHM_BYTES:
        return [
            f"/dev/shm is only {shm.size_bytes / 2**20:.0f} MiB ({shm.available_bytes / 2**20:.0f} MiB free): DataLoader workers pass batches through it (docker: --shm-size)"
        ]
    return []


def classify_failure(lines: list[str]) -> tuple[Cause, str | None, list[str]] | None:
    """The first failure in time: (cause, package to install, decisive lines), or None."""
    fallback: tuple[Cause, str | None, list[str]] | None = None
    unraisable = False
    for index, line in enumerate(lines):
        stripped = line.rstrip()
        if stripped.startswith("Exception ignored in"):
            # Python's report of an exception it could not raise (a __del__'s, gpu/cache_fxgraph_half.log): never fatal.
            unraisable = True
            continue
        if unraisable:
            unraisable = not EXCEPTION_LINE.match(stripped)
            continue
        if _is_warning(stripped) or _is_source_line(stripped):
            continue
        for cause, pattern in SIGNATURES:
            if cause is Cause.MISSING_DEPENDENCY:
                package = missing_package(stripped)
                if package:
                    return cause, package, [stripped]
            elif pattern.search(stripped):
                narrower, because = _refined(cause, lines, index)
                decisive = _with_exception_line(lines, index)
                return narrower, None, decisive + ([because.strip()] if because and because.strip() not in decisive else [])
        if EXCEPTION_LINE.match(stripped):
            if not WRAPPER_EXCEPTIONS.search(stripped):
                return Cause.ERROR, None, [stripped]
            # A launcher re-raising a worker's failure: the worker's own error, printed below, is the cause.
            fallback = fallback or (Cause.ERROR, None, [stripped])
    return fallback


def missing_package(line: str) -> str | None:
    """The distribution to install, when the line reports a missing dependency."""
    if not (EXCEPTION_LINE.match(line) or line.lstrip().startswith(("ModuleNotFoundError", "ImportError"))):
        return None
    m = re.search(r"No module named '([\w.]+)'", line)
    if m and ("ModuleNotFoundError" in line or "ImportError" in line):
        module = m.group(1)
        top = module.split(".")[0]
        return MODULE_TO_PACKAGE.get(module) or MODULE_TO_PACKAGE.get(top) or top.replace("_", "-")
    m = re.search(r"pip install (?:-U |--upgrade )?[`'\"]?([A-Za-z0-9][A-Za-z0-9_.\-\[\]]*(?:[=<>!~]=?[\w.*]+)?)", line)
    if m:
        return m.group(1).rstrip(".")
    return None


def _is_source_line(line: str) -> bool:
    """Source quoted in a traceback (`    raise InductorError(...)`) names errors without being one."""
    return line[:1].isspace() and not line.lstrip().startswith(('File "', "ModuleNotFoundError", "ImportError"))


def _is_warning(line: str) -> bool:
    """Warnings print before failures and cause none (`destroy_process_group() was not called`)."""
    # glog's warning prefix, bracketed (`[W1202 12:45:42.685 ...]`, c10d) or not (`W1202 12:45:42.685000 3362 file.py:1716]`,
    # torch's Python logging: inductor's fx graph cache unable to load a damaged entry, cpu/compile_cache_truncated.log).
    return bool(
        re.match(r"^\w*Warning\b", line)
        or re.search(r"\bWarning: |UserWarning: |^(\[rank\d+\]:)?\[W\d{4} |^(\[rank\d+\]:)?W\d{4} \d\d:\d\d:\d\d\.\d+ ", line)
    )


def _with_exception_line(lines: list[str], index: int) -> list[str]:
    """The matching line, plus the traceback's closing exception line when it follows."""
    decisive = [lines[index].rstrip()]
    closing = _closing_line(lines, index)
    if closing is not None and lines[closing].rstrip() not in decisive:
        decisive.append(lines[closing].rstrip())
    return decisive


def _closing_line(lines: list[str], index: int) -> int | None:
    """The index of the traceback's closing exception line at or after index, within 300 lines."""
    return next((i for i in range(index, min(len(lines), index + 300)) if EXCEPTION_LINE.match(lines[i].rstrip())), None)


def _refined(cause: Cause, lines: list[str], index: int) -> tuple[Cause, str | None]:
    """The narrower cause the traceback's own message names (REFINEMENTS), and the line that names it: a frame in
    torch.load that ends in `Weights only load failed`, a BackendCompilerFailed that chains a cached module's import failure."""
    closing = _closing_line(lines, index)
    # The message: from the matching line to the closing line and the chained lines after it, up to a blank line; with no
    # closing line (faulthandler's dump), what follows within the scan's reach.
    end = index + 300 if closing is None else closing + 1
    while closing is not None and end < len(lines) and end <= closing + 4 and lines[end].strip():
        end += 1
    # The innermost frame above the matching line: where the failure was raised (a traceback's last `File` line).
    frame = next((lines[i] for i in range(index - 1, max(-1, index - 40), -1) if lines[i].lstrip().startswith('File "')), None)
    message = [*([frame] if frame else []), *lines[index:end]]
    for narrower, pattern in REFINEMENTS.get(cause, []):
        found = next((line for line in message if pattern.search(line)), None)
        if found is not None:
            return narrower, found
    return cause, None


def _kernel_oom_lines(snap: HealthSnapshot, also: set[int] | None = None) -> list[str]:
    """OOM-kill lines naming the run's own processes: its recorded PID, any PID seen in its tree (DataLoader
    workers, torchrun's ranks), or `also` (workers the trainer named). A host's kernel log holds other jobs' kills too."""
    ours = _run_pids(snap) | (also or set())
    return [line.strip() for line in snap.kernel_lines if _oom_pid(line) in ours][:3]


def _others_oom(snap: HealthSnapshot) -> list[str]:
    """A note that the kernel's OOM kills were of other processes, so a reader does not take them for the cause."""
    ours = _run_pids(snap)
    others = [line.strip() for line in snap.kernel_lines if (pid := _oom_pid(line)) is not None and pid not in ours]
    if not others:
        return []
    known = f"PID {', '.join(map(str, sorted(ours)))}" if ours else "no PID recorded"
    return [f"the kernel's OOM kills name other processes, not the run's ({known}): {others[-1]}"]


def _run_pids(snap: HealthSnapshot) -> set[int]:
    return {pid for pid in (snap.pid, *snap.tree_pids) if pid}


def _oom_pid(line: str) -> int | None:
    m = KERNEL_OOM.search(line)
    if not m:
        return None
    return next((int(v) for v in m.groupdict().values() if v is not None), None)


# ---- the trainer is alive --------------------------------------------------------------------


def _alive(snap: HealthSnapshot, t: Thresholds, p: Progress, metrics: Metrics, gpu_indexes: list[int] | None = None) -> Diagnosis:
    now = snap.seconds_since_launch or 0.0
    gpu_evidence = _gpu_evidence(snap, t, p, gpu_indexes)
    window = stall_window_seconds(p, t)
    if metrics.steps_seen == 0:
        return _starting_or_stalled(snap, t, p, metrics, gpu_evidence)
    stepped_at = p.step_changed_at if p.step_changed_at is not None else now
    since_step = now - stepped_at
    # A checkpoint written since the last step line, within the window, is a save in progress (a long torch.save
    # prints nothing): killing it mid-save leaves a half-written checkpoint to resume from.
    saved = p.checkpoint_written_at
    saving = saved is not None and saved > stepped_at and now - saved < window
    if since_step >= window and (snap.seconds_since_log_write or 0) >= min(window, since_step) and not saving:
        ev = [
            f"no new step line for {since_step:.0f} s (stall window {window:.0f} s)",
            f"last step line: {_last_step_line(snap, t)}",
            *gpu_evidence,
        ]
        return Diagnosis(verdict=Verdict.STALLED, summary=f"no new step for {since_step:.0f} s", evidence=ev, metrics=metrics)
    save_note = (
        [f"no step line for {since_step:.0f} s, but checkpoint_dir was written {now - saved:.0f} s ago: a save in progress"]
        if saving and saved is not None and since_step >= window
        else []
    )
    reading = read_log(snap.log_tail, t)
    if diverged(reading, t.diverged_steps):
        first = metrics.first_nonfinite_step
        ev = [
            f"the loss of the last {t.diverged_steps} step lines is not finite; first non-finite at step {first}",
            f"last step line: {_last_step_line(snap, t)}",
        ]
        return Diagnosis(verdict=Verdict.DIVERGED, summary=f"loss not finite since step {first}", evidence=ev, metrics=metrics)
    if metrics.steps_seen < t.healthy_steps:
        return Diagnosis(
            verdict=Verdict.STARTING,
            summary=f"{metrics.steps_seen} step line(s) so far",
            evidence=[_last_step_line(snap, t)],
            metrics=metrics,
        )
    tps, base = metrics.tokens_per_second, t.baseline_tokens_per_second
    if tps is not None and base is not None and tps < t.degraded_ratio * base:
        warnings = _dedupe([line.strip() for line in [*snap.log_matches, *snap.log_tail] if SLOWDOWN_WARNINGS.search(line)])[:3]
        ev = [
            f"{tps:.0f} tok/s is {tps / base:.0%} of the {base:.0f} tok/s baseline (threshold {t.degraded_ratio:.0%})",
            f"last step line: {_last_step_line(snap, t)}",
            *warnings,
            *gpu_evidence,
        ]
        return Diagnosis(verdict=Verdict.DEGRADED, summary=f"{tps:.0f} tok/s, {tps / base:.0%} of baseline", evidence=ev, metrics=metrics)
    ev = [f"last step line: {_last_step_line(snap, t)}", *save_note, *gpu_evidence]
    return Diagnosis(
        verdict=Verdict.HEALTHY, summary=f"step {metrics.last_step}" + (f", {tps:.0f} tok/s" if tps else ""), evidence=ev, metrics=metrics
    )


def _starting_or_stalled(snap: HealthSnapshot, t: Thresholds, p: Progress, metrics: Metrics, gpu_evidence: list[str]) -> Diagnosis:
    now = snap.seconds_since_launch or 0.0
    # A checkpoint written counts as the log growing does (a save before the first step: step 0's).
    last_progress = max(x for x in (p.log_grew_at, p.gpu_rose_at, p.checkpoint_written_at, 0.0) if x is not None)
    quiet = min(now - last_progress, snap.seconds_since_log_write if snap.seconds_since_log_write is not None else now)
    tail = _last_lines(snap, 1)
    if now < t.startup_grace_seconds or quiet < t.stall_window_floor_seconds:
        note = (
            [] if now < t.startup_grace_seconds else [f"start-up is past its {t.startup_grace_seconds:.0f} s grace but still progressing"]
        )
        return Diagnosis(
            verdict=Verdict.STARTING, summary=f"starting for {now:.0f} s", evidence=[*note, *tail, *gpu_evidence], metrics=metrics
        )
    ev = [f"no step line {now:.0f} s after launch and no progress for {quiet:.0f} s", *tail, *gpu_evidence]
    return Diagnosis(verdict=Verdict.STALLED, summary="start-up made no progress", evidence=ev, metrics=metrics)


def _gpu_evidence(snap: HealthSnapshot, t: Thresholds, p: Progress, gpu_indexes: list[int] | None = None) -> list[str]:
    # Only the target's GPUs: another job's idle GPU says nothing of this run.
    gpus = [g for g in snap.gpus if gpu_indexes is None or g.index in gpu_indexes]
    if not gpus:
        return []
    lines = []
    expected = gpus[: t.expected_gpus] if t.expected_gpus else gpus
    if expected and all(g.memory_used_mib == 0 for g in expected):
        lines.append(f"every expected GPU ({len(expected)}) at 0 MiB while the trainer is alive")
    now = snap.seconds_since_launch or 0.0
    idle_since = p.gpu_busy_at if p.gpu_busy_at is not None else 0.0
    if p.polls > 1 and now - idle_since >= stall_window_seconds(p, t) and all(g.utilization_percent == 0 for g in expected):
        lines.append(f"GPU utilisation 0 % for {now - idle_since:.0f} s")
    return lines


def _last_lines(snap: HealthSnapshot, n: int) -> list[str]:
    return [line.rstrip() for line in snap.log_tail if line.strip()][-n:]


def _last_step_line(snap: HealthSnapshot, t: Thresholds) -> str:
    step_of = step_reader(t)
    return next((line.rstrip() for line in reversed(snap.log_tail) if step_of(line) is not None), "")


def _session_line(snap: HealthSnapshot) -> str:
    return "tmux session alive" if snap.session_alive else "tmux session gone"


def _dedupe(lines: list[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in lines if not (x in seen or seen.add(x))]
