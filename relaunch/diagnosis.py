"""Pure judgement: from snapshots to a verdict, a cause, evidence and metrics. No I/O here."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field, replace

from pydantic import BaseModel, Field

from relaunch.config import Thresholds
from relaunch.hardware import disk_full_evidence, gpu_fault_evidence
from relaunch.snapshot import HealthSnapshot
from relaunch.torchrun import RankFailure, collective_timeouts, root_cause
from relaunch.verdicts import (
    DEFAULT_LOSS,
    EXCEPTION_LINE,
    KERNEL_OOM,
    MODULE_TO_PACKAGE,
    NATIVE_SIGNALS,
    SIGNAL_NAMES,
    SIGNATURES,
    SLOWDOWN_WARNINGS,
    WRAPPER_EXCEPTIONS,
    Cause,
    Verdict,
)

DEFAULT_THROUGHPUT = re.compile(r"(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[kKmM])?\s*(?:tok(?:en)?s?)\s*/\s*s(?:ec)?\b", re.IGNORECASE)
UNIT = {"k": 1e3, "m": 1e6}


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
    step_intervals: tuple[float, ...] = ()
    log_size_bytes: int = 0
    log_grew_at: float | None = None
    gpu_memory_mib: int = 0
    gpu_rose_at: float | None = None
    gpu_busy_at: float | None = None
    gpu_all_zero_polls: int = 0
    polls: int = 0


@dataclass(frozen=True)
class Reading:
    steps: list[int] = field(default_factory=list)
    throughputs: list[float] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)  # one per step line; None where none is printed


def read_log(lines: list[str], thresholds: Thresholds) -> Reading:
    step_re = re.compile(thresholds.step_pattern)
    tput_re = re.compile(thresholds.throughput_pattern) if thresholds.throughput_pattern else DEFAULT_THROUGHPUT
    loss_re = re.compile(thresholds.loss_pattern, re.IGNORECASE) if thresholds.loss_pattern else DEFAULT_LOSS
    steps, tputs, losses = [], [], []
    for line in lines:
        m = step_re.search(line)
        if not m:
            continue
        steps.append(int(m.group("step")))
        loss = loss_re.search(line)
        losses.append(_float_or_none(loss.group("value")) if loss else None)
        t = tput_re.search(line)
        if t:
            unit = (t.groupdict().get("unit") or "").lower()
            tputs.append(float(t.group("value")) * UNIT.get(unit, 1.0))
    return Reading(steps, tputs, losses)


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
    all_zero = bool(snap.gpus) and all(g.memory_used_mib == 0 for g in snap.gpus)
    return replace(p, gpu_all_zero_polls=p.gpu_all_zero_polls + 1 if all_zero else 0)


def stall_window_seconds(progress: Progress, thresholds: Thresholds) -> float:
    """The floor, or a multiple of the observed step interval when that is longer."""
    if not progress.step_intervals:
        return thresholds.stall_window_floor_seconds
    typical = statistics.median(progress.step_intervals)
    return max(thresholds.stall_window_floor_seconds, thresholds.stall_interval_factor * typical)


def diagnose(snap: HealthSnapshot, thresholds: Thresholds, progress: Progress | None = None, min_free_disk_gb: float = 0.0) -> Diagnosis:
    """The verdict for one snapshot, given what earlier polls of the same attempt saw."""
    progress = progress or advance(Progress(), snap, thresholds)
    metrics = _metrics(snap, thresholds)
    if not snap.launched and not snap.session_alive and snap.exit_code is None:
        return Diagnosis(
            verdict=Verdict.UNKNOWN, summary="no trainer on record", evidence=["no launch recorded and no tmux session"], metrics=metrics
        )
    if snap.exit_code is not None or not snap.pid_alive:
        return _hardware(snap, thresholds, metrics, min_free_disk_gb) or _gone(snap, metrics)
    return _alive(snap, thresholds, progress, metrics)


def _hardware(snap: HealthSnapshot, t: Thresholds, metrics: Metrics, min_free_disk_gb: float) -> Diagnosis | None:
    """A failed GPU or a full disk outranks whatever the trainer printed: its errors are their knock-on."""
    gpu = gpu_fault_evidence(snap, t.expected_gpus)
    if gpu:
        return Diagnosis(
            verdict=Verdict.CRASHED, cause=Cause.GPU_FAULT, summary=gpu[0], evidence=[*gpu, *_kernel_note(snap)], metrics=metrics
        )
    full = disk_full_evidence(snap, min_free_disk_gb)
    if full:
        return Diagnosis(
            verdict=Verdict.CRASHED, cause=Cause.DISK_FULL, summary=full[0], evidence=full, metrics=metrics, disk_still_full=True
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


def _gone(snap: HealthSnapshot, metrics: Metrics) -> Diagnosis:
    code = snap.exit_code
    if code == 0:
        return Diagnosis(verdict=Verdict.FINISHED, summary="the trainer exited 0", evidence=_last_lines(snap, 3), metrics=metrics)
    cause = classify_failure([*snap.log_matches, *snap.log_tail])
    oom_kernel = _kernel_oom_lines(snap)
    exit_text = f"exit code {code}" if code is not None else "no exit code recorded"
    if cause is not None and cause[0] is Cause.BROKEN_CHECKPOINT and metrics.steps_seen:
        # It stepped, so the checkpoint it was given loaded: the load error is about something else.
        cause = (Cause.ERROR, None, cause[2])
    rank = root_cause(snap.log_tail)
    if rank and (cause is None or (cause[0] is Cause.ERROR and WRAPPER_EXCEPTIONS.search(cause[2][-1]))):
        # torchrun's wrapper error says nothing; the rank that failed first does.
        return _rank_failure(rank, snap, metrics, exit_text)
    if cause is not None and not (oom_kernel and cause[0] is Cause.ERROR):
        kind, package, decisive = cause
        if kind is Cause.NCCL_FAILURE:
            decisive = [*decisive, *collective_timeouts([*snap.log_matches, *snap.log_tail])]
            decisive += [rank.describe()] if rank else []
        summary = f"{kind.value}: {decisive[-1].strip()}" if decisive else kind.value
        if package:
            summary = f"missing_dependency: install {package}"
        extra = (
            _checkpoint_note(snap)
            if kind is Cause.BROKEN_CHECKPOINT
            else _shm_note(snap)
            if kind in (Cause.NATIVE_CRASH, Cause.DISK_FULL)
            else []
        )
        extra += _kernel_note(snap) if kind is Cause.GPU_FAULT else []
        # A full /dev/shm does not empty itself on a relaunch: a person must give the container more.
        shm_full = kind is Cause.DISK_FULL and any("shared memory" in line for line in decisive)
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=kind,
            package=package,
            summary=summary,
            evidence=[*decisive, *extra, exit_text],
            metrics=metrics,
            checkpoint=snap.checkpoint,
            disk_still_full=shm_full,
        )
    if oom_kernel or (code == 137 and any("Killed" == line.strip() for line in snap.log_tail[-3:])):
        evidence = [*oom_kernel, exit_text] if oom_kernel else [*_last_lines(snap, 2), exit_text]
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=Cause.HOST_OOM_KILLED,
            summary="killed by the kernel's OOM killer",
            evidence=evidence,
            metrics=metrics,
        )
    if code is not None and code - 128 in NATIVE_SIGNALS:
        name = SIGNAL_NAMES[code - 128]
        evidence = [*_last_lines(snap, 2), *_shm_note(snap), f"{exit_text} ({name}, raised by the trainer's own native code)"]
        return Diagnosis(verdict=Verdict.CRASHED, cause=Cause.NATIVE_CRASH, summary=f"died of {name}", evidence=evidence, metrics=metrics)
    if code is not None and code > 128:
        name = SIGNAL_NAMES.get(code - 128, f"signal {code - 128}")
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=Cause.KILLED,
            summary=f"killed by {name}",
            evidence=[*_last_lines(snap, 2), f"{exit_text} ({name})"],
            metrics=metrics,
        )
    if code is None:
        evidence = [_session_line(snap), "trainer PID not alive", exit_text, *_last_lines(snap, 2)]
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
    for index, line in enumerate(lines):
        stripped = line.rstrip()
        if _is_warning(stripped) or _is_source_line(stripped):
            continue
        for cause, pattern in SIGNATURES:
            if cause is Cause.MISSING_DEPENDENCY:
                package = missing_package(stripped)
                if package:
                    return cause, package, [stripped]
            elif pattern.search(stripped):
                return cause, None, _with_exception_line(lines, index)
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
    return bool(re.match(r"^\w*Warning\b", line) or re.search(r"\bWarning: |UserWarning: |^(\[rank\d+\]:)?\[W\d{4} ", line))


def _with_exception_line(lines: list[str], index: int) -> list[str]:
    """The matching line, plus the traceback's closing exception line when it follows."""
    decisive = [lines[index].rstrip()]
    for later in lines[index + 1 : index + 300]:
        if EXCEPTION_LINE.match(later.rstrip()):
            if later.rstrip() not in decisive:
                decisive.append(later.rstrip())
            break
    return decisive


def _kernel_oom_lines(snap: HealthSnapshot) -> list[str]:
    pid = str(snap.pid) if snap.pid else None
    hits = [line for line in snap.kernel_lines if KERNEL_OOM.search(line)]
    if pid and any(f"process {pid} " in h or f"pid={pid}," in h for h in hits):
        return [h for h in hits if pid in h][:3]
    # The host sends only lines since launch; the killed PID may be a child of the recorded one.
    return hits[-3:] if snap.exit_code in (None, 137) else []


# ---- the trainer is alive --------------------------------------------------------------------


def _alive(snap: HealthSnapshot, t: Thresholds, p: Progress, metrics: Metrics) -> Diagnosis:
    now = snap.seconds_since_launch or 0.0
    gpu_evidence = _gpu_evidence(snap, t, p)
    window = stall_window_seconds(p, t)
    if metrics.steps_seen == 0:
        return _starting_or_stalled(snap, t, p, metrics, gpu_evidence)
    since_step = now - (p.step_changed_at if p.step_changed_at is not None else now)
    if since_step >= window and (snap.seconds_since_log_write or 0) >= min(window, since_step):
        ev = [
            f"no new step line for {since_step:.0f} s (stall window {window:.0f} s)",
            f"last step line: {_last_step_line(snap, t)}",
            *gpu_evidence,
        ]
        return Diagnosis(verdict=Verdict.STALLED, summary=f"no new step for {since_step:.0f} s", evidence=ev, metrics=metrics)
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
    ev = [f"last step line: {_last_step_line(snap, t)}", *gpu_evidence]
    return Diagnosis(
        verdict=Verdict.HEALTHY, summary=f"step {metrics.last_step}" + (f", {tps:.0f} tok/s" if tps else ""), evidence=ev, metrics=metrics
    )


def _starting_or_stalled(snap: HealthSnapshot, t: Thresholds, p: Progress, metrics: Metrics, gpu_evidence: list[str]) -> Diagnosis:
    now = snap.seconds_since_launch or 0.0
    last_progress = max(x for x in (p.log_grew_at, p.gpu_rose_at, 0.0) if x is not None)
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


def _gpu_evidence(snap: HealthSnapshot, t: Thresholds, p: Progress) -> list[str]:
    if not snap.gpus:
        return []
    lines = []
    expected = snap.gpus[: t.expected_gpus] if t.expected_gpus else snap.gpus
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
    step_re = re.compile(t.step_pattern)
    return next((line.rstrip() for line in reversed(snap.log_tail) if step_re.search(line)), "")


def _session_line(snap: HealthSnapshot) -> str:
    return "tmux session alive" if snap.session_alive else "tmux session gone"


def _dedupe(lines: list[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in lines if not (x in seen or seen.add(x))]
