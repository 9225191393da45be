"""Pure judgement: from snapshots to a verdict, a cause, evidence and metrics. No I/O here."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from relaunch.activity import HANG_CEILING_FACTOR, Activity, read_activity, stack_sample, typical_step_seconds
from relaunch.config import Thresholds
from relaunch.hardware import disk_full_evidence, full_disk_evidence, gpu_fault_evidence
from relaunch.logtext import NUMBER, printed_number, training_step_mention
from relaunch.signatures import (
    CACHE_DAMAGE_WARNING,
    DATALOADER_WORKER_DIED,
    DEFAULT_LOSS,
    EXCEPTION_LINE,
    KERNEL_OOM,
    LOAD_ERROR_DETAIL,
    MODULE_TO_PACKAGE,
    NATIVE_SIGNALS,
    NOT_TRAINING_PROGRESS,
    OUTSIDE_SIGNALS,
    PEER_LOST,
    REFINEMENTS,
    SIGNAL_NAMES,
    SIGNATURES,
    SLOWDOWN_WARNINGS,
    STEP_LINE,
    TQDM_PROGRESS,
    WRAPPER_EXCEPTIONS,
)
from relaunch.snapshot import HealthSnapshot
from relaunch.torchrun import (
    RankFailure,
    collective_timeouts,
    failed_ranks,
    rank_lines,
    rendezvous_gap,
    root_cause,
    worker_group_failures,
)
from relaunch.vocabulary import Cause, Verdict

_TOKENS_PER_SECOND = r"tok(?:en)?s?(?:[ _]?per[ _]?|\s*/\s*)s(?:ec(?:ond)?)?"
DEFAULT_THROUGHPUT = re.compile(
    # `21.3Ktok/s`, `21500 tok/s`, `21,300 tok/s`, `2.13e+04 tok/s`, `1.5M tokens/s`, `900 tok/sec`, `21300 tokens per
    # second`; or a key first: `tokens_per_sec: 2660`, `tok/s=21300`, `tok/s: 21,300`, `tokens/s (total): 21.3k`. The
    # number as printed, separators and all (logtext.NUMBER): logtext.printed_number says whether its value is certain.
    rf"(?<![\w.,'\u2009\u202f\u00a0])(?P<value>{NUMBER})\s*(?P<unit>[kKmM])?\s*{_TOKENS_PER_SECOND}(?![\w])"
    rf"|(?<![A-Za-z]){_TOKENS_PER_SECOND}(?P<keyscope>(?:[ _/-](?:per[ _-]?)?(?:gpu|device|dev|rank))?)[)\]'\"]?\s*[=:]\s*(?P<value2>{NUMBER})(?P<unit2>[kKmM](?![A-Za-z]))?(?![\w.])",
    re.IGNORECASE,
)
UNIT = {"k": 1e3, "m": 1e6}
# A figure that is not the run's current throughput: a target, a baseline, a peak (`target 21500 tok/s`, `peak_tok/s:
# 30000`, `21500 tok/s (expected)`). Beside another figure it is passed over; alone it is no reading.
NOT_A_READING_BEFORE = re.compile(
    r"\b(?:target|expected|baseline|peak|max(?:imum)?|min(?:imum)?|best|goal|ideal|theoretical|planned)[\s_:=(-]*$", re.I
)
NOT_A_READING_AFTER = re.compile(
    r"^\s*[(\[]?\s*(?:target|expected|baseline|peak|max(?:imum)?|min(?:imum)?|best|goal|ideal)\b(?!\s*[:=]?\s*\d)", re.I
)
# A degraded verdict stops the run: it needs this many throughput readings in a row, the last step lines that print
# one, each certain and each below the threshold. One line, or one figure read uncertain, stops nothing.
DEGRADED_READINGS = 3
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
    watching: str | None = Field(
        None,
        description="What the poll must still see before it may settle (a quiet run's history too short for its stall "
        "window, its stacks not yet sampled): the verdict stands for now and stops nothing.",
    )
    want_stacks: bool = Field(False, description="The next poll should sample the tree's Python stacks (quiet log, busy tree).")
    repo_dir_missing: str | None = Field(
        None, description="The target's repo_dir, where the host has no such folder and nothing is on record: a target to fix, not a run."
    )

    @property
    def settled(self) -> bool:
        return self.verdict is not Verdict.STARTING and self.watching is None


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
    # py-spy samples of a quiet, busy tree: (host time, every thread of every process waiting).
    stack_samples: tuple[tuple[float, bool, str], ...] = ()


@dataclass(frozen=True)
class Reading:
    steps: list[int] = field(default_factory=list)
    throughputs: list[float] = field(default_factory=list)  # the certain readings
    # One per step line that prints a throughput figure: its value, or None where the figure is not certain.
    throughput_lines: list[float | None] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)  # one per step line; None where none is printed


def read_log(lines: list[str], thresholds: Thresholds) -> Reading:
    step_of = step_reader(thresholds)
    tput_re = re.compile(thresholds.throughput_pattern) if thresholds.throughput_pattern else DEFAULT_THROUGHPUT
    loss_re = re.compile(thresholds.loss_pattern, re.IGNORECASE) if thresholds.loss_pattern else DEFAULT_LOSS
    steps: list[int] = []
    tputs: list[float | None] = []
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
        tput = read_throughput(line, tput_re)
        if tput is not None:
            tputs.append(tput.value)
    return Reading(steps=steps, throughputs=[v for v in tputs if v is not None], throughput_lines=tputs, losses=losses)


def step_reader(thresholds: Thresholds) -> Callable[[str], tuple[int, bool] | None]:
    """A function from a log line to (its training step, whether it is a tqdm redraw), or None for no step line.

    A step mention that a resume, checkpoint load or save or an evaluation governs in its clause is never a training
    step, whatever the pattern (NOT_A_TRAINING_STEP, logtext.training_step_mention): the first mention that is one
    counts. Under the default pattern a tqdm or rich bar's count is a step too, unless the bar is loading or
    evaluating, and so are the shapes of STEP_LINE (`Step 12/1000`, `global_step: 12`, `iteration 12`)."""
    step_re = re.compile(thresholds.step_pattern)
    default = thresholds.step_pattern == DEFAULT_STEP_PATTERN
    patterns = (step_re, STEP_LINE) if default else (step_re,)

    def step_of(line: str) -> tuple[int, bool] | None:
        bar = TQDM_PROGRESS.search(line) if default and ("[" in line or "\u2022" in line) else None
        if bar:
            n = int(bar["n"] or bar["n2"] or bar["n3"])
            # 0 done is the bar drawn before the first iteration (which may compile for minutes): no step yet.
            if n == 0 or NOT_TRAINING_PROGRESS.search(line[: bar.start()]):  # the bar's description
                return None
            return n, True
        for pattern in patterns:
            for m in pattern.finditer(line):
                if training_step_mention(line, m.start(), m.end()):
                    text = next(g for g in (m.groupdict().get(k) for k in ("step", "step2", "step3", "step4")) if g)
                    return int(text.replace(",", "")), False
        return None

    return step_of


@dataclass(frozen=True)
class ThroughputReading:
    """A line's throughput figure: its value in tokens per second, or None where the figure is not certain."""

    value: float | None


def throughput(line: str, pattern: re.Pattern[str]) -> float | None:
    """Tokens per second on one line; None where it prints none, or none that is certain (read_throughput)."""
    reading = read_throughput(line, pattern)
    return reading.value if reading else None


def read_throughput(line: str, pattern: re.Pattern[str]) -> ThroughputReading | None:
    """Tokens per second on one line: the whole job's figure over one GPU's (`2660 tok/s/gpu | 21.3Ktok/s total`
    reads 21300), a figure of no stated scope over a per-GPU one, the first of its kind otherwise. A line with
    per-GPU figures only reads the per-GPU one, as the baseline set from the same printout does. None: no figure;
    a reading of value None: the figure chosen is not certain (`21.300 tok/s`, `21,3 tok/s`), or the line's only
    figures are targets or peaks (`target 21500 tok/s`)."""
    best: tuple[int, float | None] | None = None  # (rank: 0 total, 1 unscoped, 2 per device, 3 no reading; value)
    for m in pattern.finditer(line):
        groups = m.groupdict()
        text = groups.get("value") or groups.get("value2")
        if text is None:
            continue
        unit = groups.get("unit") or groups.get("unit2") or ""
        value = printed_number(text, unit)
        lead = line[max(0, m.start() - 40) : m.start()]
        if value is not None and re.fullmatch(r"\d{3}(?:\.\d+)?", text.split("e")[0].split("E")[0]) and lead.endswith(" "):
            if re.search(r"(?:^|\s)\d{1,3} $", lead):  # `21 300 tok/s`: a plain space between digit groups, or two figures?
                value = None
        before = re.split(r"[|,;]", lead)[-1]
        after = line[m.end() : m.end() + 24]
        if NOT_A_READING_BEFORE.search(before) or NOT_A_READING_AFTER.search(after):
            rank = 3
        elif TOTAL_AFTER.search(after) or TOTAL_BEFORE.search(before) or TOTAL_BEFORE.search(m.group(0)):
            rank = 0
        elif groups.get("keyscope") or PER_DEVICE_AFTER.search(after) or PER_DEVICE_BEFORE.search(before):
            rank = 2
        else:
            rank = 1
        if best is None or rank < best[0]:
            best = (rank, value)
    if best is None:
        return None
    return ThroughputReading(None if best[0] == 3 else best[1])


def slow_throughput(reading: Reading, threshold: float) -> list[float] | None:
    """The last DEGRADED_READINGS throughput readings where each is certain and below threshold; None otherwise."""
    last = reading.throughput_lines[-DEGRADED_READINGS:]
    if len(last) < DEGRADED_READINGS or any(v is None or v >= threshold for v in last):
        return None
    return [v for v in last if v is not None]


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


def judged_text(snap: HealthSnapshot, thresholds: Thresholds) -> HealthSnapshot:
    """The snapshot whose log tail a live run is judged by: its recorded log, or, where that holds no step line and a
    log of the trainer's own does (`logging` to a file of its choosing, stdout silent), that one."""
    if not snap.own_log_tail or not snap.pid_alive or read_log(snap.log_tail, thresholds).steps:
        return snap
    if not read_log(snap.own_log_tail, thresholds).steps:
        return snap
    return snap.model_copy(update={"log_tail": snap.own_log_tail})


def advance(progress: Progress, snap: HealthSnapshot, thresholds: Thresholds) -> Progress:
    """Fold one snapshot into the attempt's progress."""
    snap = judged_text(snap, thresholds)
    now = snap.seconds_since_launch or 0.0
    reading = read_log(snap.log_tail, thresholds)
    p = replace(progress, polls=progress.polls + 1)
    if snap.stacks is not None and snap.host_now_epoch is not None:
        p = replace(p, stack_samples=(*p.stack_samples, (snap.host_now_epoch, *stack_sample(snap.stacks)))[-12:])
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


def stall_window_seconds(progress: Progress, thresholds: Thresholds, activity: Activity | None = None) -> float:
    """The floor, or a multiple of the observed step interval when that is longer: the intervals of this check's polls
    and of every earlier poll of the run (its journal), so a run stepping every 24 s has a 240 s window on any look."""
    typical = typical_step_seconds(activity, progress.step_intervals)
    if typical is None:
        return thresholds.stall_window_floor_seconds
    return max(thresholds.stall_window_floor_seconds, thresholds.stall_interval_factor * typical)


def run_activity(snap: HealthSnapshot, progress: Progress, thresholds: Thresholds, last_step: int | None) -> tuple[Activity | None, float]:
    """The run's history and its stall window (the window needs the history's step intervals, the CPU the window)."""
    first = read_activity(snap, last_step, thresholds.stall_window_floor_seconds, progress.stack_samples)
    window = stall_window_seconds(progress, thresholds, first)
    return read_activity(snap, last_step, window, progress.stack_samples), window


def _quiet_verdict(
    snap: HealthSnapshot, activity: Activity, window: float, metrics: Metrics, what: str, evidence: list[str]
) -> Diagnosis | None:
    """A run with no step and no write for the window: stalled, watched on, or judged busy (None: not quiet).

    Never on one look: history shorter than the window is watched, not judged. CPU the tree gained over the window is
    work unless every stack sampled over it waits; a busy tree whose stacks cannot be read is given HANG_CEILING_FACTOR
    windows."""
    since_write = activity.since_write_seconds if activity.since_write_seconds is not None else activity.history_seconds
    # No advance seen: the step stood still all the history long, where polls journaled it; where none did (single
    # looks), a step line is a write, so the writes are the history of the steps too.
    since_step = (
        activity.since_step_seconds
        if activity.since_step_seconds is not None
        else activity.history_seconds
        if activity.steps_journaled
        else since_write
    )
    holding = Verdict.HEALTHY if metrics.steps_seen else Verdict.STARTING
    young = activity.history_seconds < window
    # A history shorter than the window cannot show a quiet one; the log's mtime against the clock then says only
    # whether to watch on (a stale mtime decides nothing: a clock behind, a log elsewhere).
    suspect = young and (snap.seconds_since_log_write or 0.0) >= window and since_step >= activity.history_seconds
    if (since_step < window or since_write < window) and not suspect:
        return None
    quiet = f"no {what} and no write (log, open files, checkpoint_dir) for {min(since_step, since_write):.0f} s"
    if young:
        return Diagnosis(
            verdict=holding,
            summary=f"quiet; watching it for its {window:.0f} s stall window ({activity.history_seconds:.0f} s seen)",
            evidence=[
                quiet,
                f"watched for {activity.history_seconds:.0f} s of the {window:.0f} s window: nothing is judged on one look",
                *evidence,
            ],
            metrics=metrics,
            watching=f"the stall window: {activity.history_seconds:.0f} of {window:.0f} s",
        )
    cpu = f"its processes used {activity.cpu_cores:.2f} cores over the window" if activity.cpu_cores is not None else "CPU not measured"
    if not activity.busy():
        return Diagnosis(
            verdict=Verdict.STALLED,
            summary=f"no new step for {since_step:.0f} s and its processes idle",
            evidence=[f"{quiet} (stall window {window:.0f} s, watched {activity.history_seconds:.0f} s)", cpu, *evidence],
            metrics=metrics,
        )
    idle_for = activity.idle_for_seconds
    if activity.stacks_waiting and idle_for is not None and 0 < idle_for < window:
        # Its CPU over the window was work done before the samples (they wait now, and the tree is idle since): quiet
        # counts from when that work ended, and a full window idle is the idle rule's.
        return Diagnosis(
            verdict=holding,
            summary=f"quiet for {since_step:.0f} s; it computed until {idle_for:.0f} s ago and waits since",
            evidence=[quiet, f"{cpu}, none of it in the last {idle_for:.0f} s, whose sampled stacks wait", *evidence],
            metrics=metrics,
            watching=f"the tree's work ended {idle_for:.0f} s ago, of a {window:.0f} s window",
        )
    if activity.stacks_waiting:
        return Diagnosis(
            verdict=Verdict.STALLED,
            summary=f"no new step for {since_step:.0f} s: every stack waits (a hang)",
            evidence=[
                f"{quiet} (stall window {window:.0f} s)",
                f"{cpu}, but every thread of every sampled stack waits (a collective, a barrier, a lock, a queue, a sleep)",
                *evidence,
            ],
            metrics=metrics,
        )
    if activity.stacks_waiting is False:
        return None  # its stacks compute (an evaluation, a long step, a save, a compile): work, not a stall
    # Only where its stacks were asked for and could not be read: a check's first look has sampled nothing yet, and a
    # busy tree quiet for long (a buffering pipe, a long evaluation) is sampled before it is judged, never on one look.
    # Quiet for that long: no step and no write (a first step line after a long start-up is a write, not yet an advance).
    if activity.stacks_unreadable and min(since_step, since_write) >= HANG_CEILING_FACTOR * window:
        return Diagnosis(
            verdict=Verdict.STALLED,
            summary=f"no new step for {since_step:.0f} s though its processes are busy",
            evidence=[f"{quiet}: {HANG_CEILING_FACTOR:.0f} stall windows", cpu, "its stacks could not be sampled (py-spy)", *evidence],
            metrics=metrics,
        )
    return Diagnosis(
        verdict=holding,
        summary=f"quiet for {since_step:.0f} s but busy: sampling its stacks",
        evidence=[quiet, f"{cpu}: computing, or spinning in a hang? its stacks decide", *evidence],
        metrics=metrics,
        watching="the tree's stacks",
        want_stacks=True,
    )


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
    snap = judged_text(snap, thresholds)
    progress = progress or advance(Progress(), snap, thresholds)
    metrics = _metrics(snap, thresholds)
    settled = _unmanaged_or_stopped(snap, metrics)
    if settled is not None:
        return settled
    if not snap.launched and not snap.session_alive and snap.exit_code is None:
        if snap.repo_dir_missing:
            # Not a run to recover yet: a launch from a folder that is not there fails; a person fixes the target.
            return Diagnosis(
                verdict=Verdict.UNKNOWN,
                summary=f"no trainer on record, and repo_dir {snap.repo_dir_missing} does not exist on {snap.host}: nothing can be launched from it",
                evidence=["no launch recorded and no tmux session", "repo_dir missing: set repo_dir to the clone, or clone it there"],
                metrics=metrics,
                repo_dir_missing=snap.repo_dir_missing,
            )
        return Diagnosis(
            verdict=Verdict.UNKNOWN, summary="no trainer on record", evidence=["no launch recorded and no tmux session"], metrics=metrics
        )
    if snap.exit_code is not None or not snap.pid_alive:
        gone = _gpu_fault(snap, thresholds, metrics, gpu_indexes) or _gone(snap, metrics, min_free_disk_gb)
        if snap.exit_code is None and snap.supervisor_alive and not snap.adopted:
            # The supervisor records the exit code once the log writer drained (seconds on a loaded host): a death
            # without one is not yet a death without a trace. Looked at again, never acted on meanwhile.
            return gone.model_copy(update={"watching": "the supervisor recording the trainer's exit code"})
        return gone
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
    if snap.strays and not snap.pid_alive:
        # A trainer of this target runs that relaunch has no record of: a launch beside it would be a second trainer
        # on the same checkpoints, and a stop on no record would end a run that may be healthy.
        evidence = [
            *[f"running, not on record: {_stray_name(line)}" for line in snap.strays],
            "a trainer started by hand outside tmux, under the target's old name, or whose state folder was removed: "
            "nothing stopped, nothing launched; let it run, or end it yourself and `relaunch recover TARGET`",
        ]
        summary = f"a trainer of this target runs without a record ({_stray_name(snap.strays[0])}): nothing stopped or launched"
        return Diagnosis(verdict=Verdict.UNMANAGED, summary=summary, evidence=evidence, metrics=metrics)
    if snap.stopped_at is not None and not snap.pid_alive and not _died_before_its_session_ended(snap):
        when = datetime.fromtimestamp(snap.stopped_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        how = snap.stopped_how or "`relaunch stop`"
        return Diagnosis(
            verdict=Verdict.STOPPED,
            summary=f"stopped on purpose ({snap.stopped_how or 'relaunch stop'}) at {when}; relaunch recover starts it again",
            evidence=[f"stopped at {when} by {how}; no trainer runs", *_last_lines(snap, 1)],
            metrics=metrics,
        )
    return None


def _died_before_its_session_ended(snap: HealthSnapshot) -> bool:
    """The session ended (a hangup recorded as a deliberate stop) after the trainer's exit was recorded: the session
    ending did not stop it, its death did; the exit record wins. A person's `relaunch stop` is recorded after the
    trainer it ended: that stop stands whatever the exit's time."""
    return bool(
        snap.stopped_how and snap.exit_at_epoch is not None and snap.stopped_at is not None and snap.exit_at_epoch < snap.stopped_at
    )


def _stray_name(line: str) -> str:
    """`123 program python train.py` as a person reads it: `python train.py` (pid 123, runs train.py in repo_dir)."""
    pid, _, rest = line.strip().partition(" ")
    how, _, command = rest.partition(" ")
    found = "carries this target's marker" if how == "marker" else "runs the launch command's program in repo_dir"
    return f"`{command.strip()}` (pid {pid}, {found})"


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


# What a trainer (or its framework) prints as training ends: `training complete`, HF's `Training completed.`,
# Lightning's `` `Trainer.fit` stopped: `max_steps=100` reached.``.
TRAINING_ENDED = re.compile(
    r"(?i)\btraining (is )?(complete|completed|finished|done|ended)\b|\b(finished|done with|end of) training\b"
    r"|stopped: `?max_(steps|epochs)=\d+`? reached"
)


def _gone(snap: HealthSnapshot, metrics: Metrics, min_free_disk_gb: float = 0.0) -> Diagnosis:
    code = snap.exit_code
    if code == 0 and snap.exit_masked and not any(TRAINING_ENDED.search(line) for line in _last_lines(snap, 6)):
        # The 0 is a wrapper script's pipeline's (tee's), not the trainer's, and the trainer never said it finished:
        # judged as a death without an exit code (its log's failure, else silent_exit), the wrapper named.
        gone = _gone(snap.model_copy(update={"exit_code": None, "exit_masked": None}), metrics, min_free_disk_gb)
        return gone.model_copy(update={"evidence": [*gone.evidence, f"the launch command exited 0, but {snap.exit_masked}"]})
    if code == 0 and snap.survivors:
        # Exit 0 while processes of this very run live on: the launch command put its trainer in the background (or a
        # daemon of it outlives it). Not finished, and no second trainer beside it: a person decides.
        return Diagnosis(
            verdict=Verdict.UNMANAGED,
            summary=f"the launch command exited 0 but its run lives on ({_stray_name(snap.survivors[0])}): nothing stopped or launched",
            evidence=[
                *[f"alive, of this run: {_stray_name(line)}" for line in snap.survivors],
                "a launch command that backgrounds its trainer (`&`, nohup, a daemon) leaves relaunch no exit to judge: "
                "launch the trainer in the foreground; until then end it yourself and `relaunch recover TARGET`",
                *_last_lines(snap, 2),
            ],
            metrics=metrics,
        )
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
    if not oom_kernel and code == 137 and not workers and not _run_pids(snap):
        # A saved log names no PID: an OOM kill of a process named like the trainer, with the exit code of a SIGKILL.
        oom_kernel = _unnamed_oom_lines(snap)
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
    if code is not None and code - 128 in OUTSIDE_SIGNALS and not oom_kernel:
        # A signal from outside ended it, whatever it printed as it went (Ctrl-C's KeyboardInterrupt traceback).
        name = SIGNAL_NAMES[code - 128]
        printed = [f"it printed as it went: {line}" for line in cause[2][-1:]] if cause else _last_lines(snap, 2)
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=Cause.KILLED,
            summary=f"killed by {name}",
            evidence=[*printed, f"{exit_text} ({name})", *_outside_note(code - 128), *_others_oom(snap)],
            metrics=metrics,
        )
    rank = root_cause(snap.log_tail)
    # The rank torchrun saw fail first died of a signal while the log's first failure only says a peer was lost: that
    # rank is the cause (an abort after a lost collective is the collective's, gpu/nccl_watchdog_timeout.log).
    lost = cause is not None and _knock_on(cause) and rank is not None and rank.signal_number not in (None, 6)
    if rank and (cause is None or (cause[0] is Cause.ERROR and WRAPPER_EXCEPTIONS.search(cause[2][-1])) or lost):
        # torchrun's wrapper error says nothing; the rank that failed first does.
        peers = [f"its peers only lost it: {cause[2][0]}"] if lost and cause else []
        return _rank_failure(rank, snap, metrics, exit_text, peers)
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
        if kind is Cause.KILLED:
            decisive = [*decisive, *_outside_note(_signal_said(decisive))]
        aborted = code == 134 or (rank is not None and rank.signal_number == 6)
        if kind is Cause.DISTRIBUTED_FAILURE and aborted:
            decisive.append("the SIGABRT that followed is this error's: nothing caught it, and C++'s terminate aborts the process")
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


def _rank_failure(rank: RankFailure, snap: HealthSnapshot, metrics: Metrics, exit_text: str, peers: list[str] | None = None) -> Diagnosis:
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
    note = _outside_note(signal) if signal in OUTSIDE_SIGNALS else []
    return Diagnosis(
        verdict=Verdict.CRASHED,
        cause=cause,
        summary=summary,
        evidence=[summary, f"launcher: {exit_text}", *note, *(peers or [])],
        metrics=metrics,
    )


OUTSIDE_NOTES = {
    2: "SIGINT is what Ctrl-C sends: a person may have meant to stop it (`relaunch stop` keeps a run stopped)",
    1: "SIGHUP: the terminal or SSH session that started it closed (a run outside tmux or nohup)",
    15: "SIGTERM: a scheduler's preemption, a shutdown or a person",
}


def _outside_note(signal: int | None) -> list[str]:
    return [OUTSIDE_NOTES[signal]] if signal in OUTSIDE_NOTES else []


def _signal_said(lines: list[str]) -> int | None:
    """The outside signal a KILLED cause's lines name: Python's KeyboardInterrupt (SIGINT), torchrun's `got signal: N`."""
    for line in lines:
        if line.strip() == "KeyboardInterrupt":
            return 2
        if m := re.search(r"got signal: (\d+)", line):
            return int(m[1])
    return None


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


Failure = tuple[Cause, str | None, list[str]]
# C++'s last words for an exception nothing caught; its message is on the `what():` line under it.
CXX_TERMINATE = re.compile(r"terminate called after throwing an instance of '")


def classify_failure(lines: list[str]) -> Failure | None:
    """The first failure in time: (cause, package to install, decisive lines), or None.

    In a log of several ranks the root cause is a rank that failed by itself, not its peers' knock-on: where the first
    failure is a lost peer or collective (PEER_LOST) or only a launcher's wrapper, a rank's own failure (its exception,
    read from its `[rankN]:` lines; a native signal in torchrun's failure table) is the cause, whatever the order of the
    ranks' lines; torchrun's root cause decides between several, the earliest otherwise."""
    first = _first_failure(lines)
    if _own(first) is not None:
        return first
    return _own_rank_failure(lines, first) or first


def _knock_on(failure: Failure) -> bool:
    """A distributed failure that only says a peer was lost (its socket closed, its collective timed out)."""
    return failure[0] is Cause.DISTRIBUTED_FAILURE and any(PEER_LOST.search(line) for line in failure[2])


def _own(found: Failure | None) -> Failure | None:
    """`found` where it is a failure of its own: neither a lost peer (a knock-on) nor only a launcher's wrapper."""
    return None if found is None or _knock_on(found) or WRAPPER_EXCEPTIONS.search(found[2][-1]) else found


def _own_rank_failure(lines: list[str], first: Failure | None) -> Failure | None:
    """The failure of a rank that failed by itself, beside ranks that only lost it; None where no rank did."""
    root, table = root_cause(lines), failed_ranks(lines)
    # (rank, where in the log, its failure); rank None: a failure in lines no rank prefixed, whose rank is not known
    own: list[tuple[int | None, int, Failure]] = []
    ranks = rank_lines(lines)
    for rank, numbered in ranks.items():
        found = _own(_first_failure([line for _, line in numbered]))
        if found is None:
            continue
        at = next((i for i, line in numbered if line.rstrip() == found[2][0]), numbered[0][0])
        own.append((rank, at, (found[0], found[1], [f"[rank{rank}]: {line}" for line in found[2]])))
    # A rank that died of its own native signal prints nothing; torchrun's table says it. An abort after a distributed
    # error is that error's consequence (C++'s terminate), not a rank's own crash.
    distributed = first is not None and first[0] is Cause.DISTRIBUTED_FAILURE
    aborted = [failure.rank for failure in table if failure.signal_number == 6]
    for failure in table:
        signal = failure.signal_number
        if signal in NATIVE_SIGNALS and not (signal == 6 and distributed) and failure.rank not in {r for r, _, _ in own}:
            own.append((failure.rank, len(lines), (Cause.NATIVE_CRASH, None, [failure.describe("its own native signal")])))
    if ranks or table:
        # A log of several ranks: C++'s terminate writes a rank's last words with no `[rankN]:` (the runtime's, not torch's
        # logging), so a rank's own uncaught error can sit in the unprefixed lines, wherever its peers' knock-on landed.
        # It is the aborted rank's, where torchrun names one rank that aborted.
        terminated = ((i, _own(_first_failure(lines[i:]))) for i, line in enumerate(lines) if CXX_TERMINATE.match(line))
        at, found = next(((i, f) for i, f in terminated if f and CXX_TERMINATE.match(f[2][0])), (len(lines), None))
        if found is not None:
            owner = aborted[0] if len(aborted) == 1 and found[0] is Cause.DISTRIBUTED_FAILURE else None
            own = [o for o in own if owner is None or o[0] != owner]
            own.append((owner, at, found))
    if not own:
        return None
    rank, _, (cause, package, decisive) = min(own, key=lambda o: (not (root and root.rank == o[0]), o[1]))
    named = (
        " (torchrun's root cause)"
        if root and root.rank == rank
        else f" (torchrun named rank {root.rank}, the first it saw exit)"
        if root
        else ""
    )
    who = f"rank {rank}" if rank is not None else "a rank"
    if first is not None and _knock_on(first):
        note = f"{who} failed by itself{named}; its peers only lost it: {first[2][0]}"
    elif first is not None:
        note = f"{who} failed by itself{named}: its own error, which {first[2][-1].strip()} only carries"
    else:
        note = f"{who} failed by itself{named}"
    return cause, package, [note, *decisive]


def _first_failure(lines: list[str]) -> Failure | None:
    """The first failure in time, line by line (SIGNATURES, then a traceback's closing exception line)."""
    fallback: Failure | None = None
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
                # C++'s terminate: its `what():` line is the message (the next Python exception line is another's).
                what = CXX_TERMINATE.match(stripped) and _what_line(lines, index)
                decisive = [stripped, what] if what else _with_exception_line(lines, index)
                return narrower, None, decisive + ([because.strip()] if because and because.strip() not in decisive else [])
        if EXCEPTION_LINE.match(stripped):
            if not WRAPPER_EXCEPTIONS.search(stripped):
                return Cause.ERROR, None, [stripped]
            # A launcher re-raising a worker's failure: the worker's own error, printed below, is the cause.
            fallback = fallback or (Cause.ERROR, None, [stripped])
    return fallback


# How far below C++'s terminate line its `what():` may come: the process writes the two lines apart, and other ranks'
# and torchrun's lines sharing the log can land between them.
WHAT_WITHIN_LINES = 40


def _what_line(lines: list[str], index: int) -> str | None:
    """The `what():` line of the terminate at `index`: the first below it, before the next terminate."""
    for line in lines[index + 1 : index + 1 + WHAT_WITHIN_LINES]:
        if line.lstrip().startswith("what():"):
            return line.strip()
        if CXX_TERMINATE.match(line):
            return None
    return None


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


# The names a trainer's processes have in the kernel's report (its `comm`): the interpreter, torch's own threads and
# workers (`pt_main_thread`, `pt_data_worker`, torchrun's `pt_elastic`), the launchers.
TRAINER_PROCESS = re.compile(r"^(?:python[\d.]*|pt_\w+|torchrun|deepspeed|accelerate|lightning)$")
KILLED_NAME = re.compile(r"Killed process \d+ \((?P<name>[^)]+)\)|\btask=(?P<task>[^,]+),pid=")
# dmesg --time-format iso, journalctl -k -o short-iso: `2026-12-02T21:59:14,545642+00:00 ...` (a wall clock; plain dmesg
# prints seconds since boot, which no run's start can be compared with).
KERNEL_ISO_TIME = re.compile(r"^(?P<t>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.]\d+)?(?P<tz>[+-]\d\d:?\d\d|Z)?")


def _unnamed_oom_lines(snap: HealthSnapshot) -> list[str]:
    """Where no PID of the run is known (a saved log, no --pid): OOM kills of a process named like the trainer, not before
    the run's start where both clocks are known, and a line saying the PID was not given. Empty if there is none."""
    started = _started_epoch(snap)
    kills, compared = [], False
    for line in snap.kernel_lines:
        named = KILLED_NAME.search(line)
        if _oom_pid(line) is None or not named or not TRAINER_PROCESS.match((named["name"] or named["task"]).strip()):
            continue
        at = _kernel_epoch(line)
        if started is not None and at is not None:
            compared = True
            if at < started - 1.0:
                continue
        kills.append(line.strip())
    if not kills:
        return []
    name = next(m["name"] or m["task"] for line in kills if (m := KILLED_NAME.search(line)))
    when = (
        "at or after the run's start (--started-at)"
        if compared
        else "at a time not compared with the run's start (the kernel lines carry no wall-clock time: dmesg --time-format iso)"
        if started is not None
        else "at a time not compared with the run's start (give --started-at, and dmesg --time-format iso)"
    )
    note = (
        f"PID not given (--pid): the kernel's OOM killer took a process named like the trainer ({name}) {when}, "
        "and exit code 137 is a SIGKILL's; with the trainer's PID the kill would be certain to be the run's"
    )
    return [*kills[:3], note]


def _kernel_epoch(line: str) -> float | None:
    m = KERNEL_ISO_TIME.match(line.strip())
    if not m:
        return None
    tz = m["tz"] or "+00:00"
    tz = "+00:00" if tz == "Z" else tz if ":" in tz else f"{tz[:3]}:{tz[3:]}"
    return datetime.fromisoformat(m["t"] + tz).timestamp()


def _started_epoch(snap: HealthSnapshot) -> float | None:
    """The run's start on the host's clock: the log's mtime, plus the seconds since that write, less those since launch."""
    if snap.log_mtime_epoch is None or snap.seconds_since_log_write is None or snap.seconds_since_launch is None:
        return None
    return snap.log_mtime_epoch + snap.seconds_since_log_write - snap.seconds_since_launch


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
    activity, window = run_activity(snap, p, t, metrics.last_step)
    if metrics.steps_seen == 0:
        return _starting_or_stalled(snap, t, p, metrics, gpu_evidence, activity)
    stepped_at = p.step_changed_at if p.step_changed_at is not None else now
    since_step = now - stepped_at
    # A checkpoint written since the last step line, within the window, is a save in progress (a long torch.save
    # prints nothing): killing it mid-save leaves a half-written checkpoint to resume from.
    saved = p.checkpoint_written_at
    saving = saved is not None and saved > stepped_at and now - saved < window
    if activity is not None:
        # The run's own history decides (RUN/journal): step advances, writes and CPU between polls, never one look.
        quiet = _quiet_verdict(snap, activity, window, metrics, "new step", [f"last step line: {_last_step_line(snap, t)}", *gpu_evidence])
        if quiet is not None:
            return quiet
    elif since_step >= window and (snap.seconds_since_log_write or 0) >= min(window, since_step) and not saving:
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
    slow = slow_throughput(reading, t.degraded_ratio * base) if base is not None else None
    if tps is not None and base is not None and slow is not None:
        tps = statistics.median(slow)
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


def _starting_or_stalled(
    snap: HealthSnapshot, t: Thresholds, p: Progress, metrics: Metrics, gpu_evidence: list[str], activity: Activity | None = None
) -> Diagnosis:
    now = snap.seconds_since_launch or 0.0
    if activity is not None and now >= t.startup_grace_seconds:
        # Past its grace, a start-up is judged as a stepping run is: by what its processes did over the window.
        quiet = _quiet_verdict(snap, activity, t.stall_window_floor_seconds, metrics, "step line", [*_last_lines(snap, 1), *gpu_evidence])
        if quiet is not None and not (
            quiet.verdict is Verdict.STALLED and p.gpu_rose_at is not None and now - p.gpu_rose_at < t.stall_window_floor_seconds
        ):
            return quiet
    if activity is not None and now >= t.startup_grace_seconds:
        return Diagnosis(
            verdict=Verdict.STARTING,
            summary=f"starting for {now:.0f} s",
            evidence=[
                f"start-up is past its {t.startup_grace_seconds:.0f} s grace but still progressing",
                *_last_lines(snap, 1),
                *gpu_evidence,
            ],
            metrics=metrics,
        )
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


def _gpu_apps_evidence(snap: HealthSnapshot) -> list[str]:
    """Which of the GPUs' processes are the run's own (its tree's PIDs): GPU memory another job holds is not its work."""
    if not snap.gpu_apps:
        return []
    tree = _run_pids(snap)
    ours = [a for a in snap.gpu_apps if a.pid in tree]
    if ours:
        return ["GPU memory held by its processes: " + ", ".join(f"PID {a.pid} ({a.used_memory_mib} MiB)" for a in ours)]
    return [
        f"none of the {len(snap.gpu_apps)} process(es) holding GPU memory is of its tree "
        "(another job's; or a container numbering PIDs its own way)"
    ]


def _gpu_evidence(snap: HealthSnapshot, t: Thresholds, p: Progress, gpu_indexes: list[int] | None = None) -> list[str]:
    # Only the target's GPUs: another job's idle GPU says nothing of this run.
    gpus = [g for g in snap.gpus if gpu_indexes is None or g.index in gpu_indexes]
    if not gpus:
        return []
    lines = _gpu_apps_evidence(snap)
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
