"""Pure judgement: from snapshots to a verdict, a cause, evidence and metrics. No I/O here."""

from __future__ import annotations

import statistics
from dataclasses import replace
from datetime import UTC, datetime

from relaunch.config import Thresholds
from relaunch.judging.activity import stack_sample
from relaunch.judging.alive import checkpoint_written_at, judge_alive
from relaunch.judging.findings import Diagnosis, Metrics, Progress, last_log_lines
from relaunch.judging.gone import judge_gone, kernel_note, stray_name
from relaunch.judging.hardware import gpu_fault_evidence
from relaunch.judging.reading import first_nonfinite, read_log
from relaunch.judging.snapshot import HealthSnapshot
from relaunch.vocabulary import Cause, Verdict


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
        gone = _gpu_fault(snap, thresholds, metrics, gpu_indexes) or judge_gone(snap, metrics, min_free_disk_gb)
        if snap.exit_code is None and snap.supervisor_alive and not snap.adopted:
            # The supervisor records the exit code once the log writer drained (seconds on a loaded host): a death
            # without one is not yet a death without a trace. Looked at again, never acted on meanwhile.
            return gone.model_copy(update={"watching": "the supervisor recording the trainer's exit code"})
        return gone
    return judge_alive(snap, thresholds, progress, metrics, gpu_indexes)


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
            *[f"running, not on record: {stray_name(line)}" for line in snap.strays],
            "a trainer started by hand outside tmux, under the target's old name, or whose state folder was removed: "
            "nothing stopped, nothing launched; let it run, or end it yourself and `relaunch recover TARGET`",
        ]
        summary = f"a trainer of this target runs without a record ({stray_name(snap.strays[0])}): nothing stopped or launched"
        return Diagnosis(verdict=Verdict.UNMANAGED, summary=summary, evidence=evidence, metrics=metrics)
    if snap.stopped_at is not None and not snap.pid_alive and not _died_before_its_session_ended(snap):
        when = datetime.fromtimestamp(snap.stopped_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        how = snap.stopped_how or "`relaunch stop`"
        return Diagnosis(
            verdict=Verdict.STOPPED,
            summary=f"stopped on purpose ({snap.stopped_how or 'relaunch stop'}) at {when}; relaunch recover starts it again",
            evidence=[f"stopped at {when} by {how}; no trainer runs", *last_log_lines(snap, 1)],
            metrics=metrics,
        )
    return None


def _died_before_its_session_ended(snap: HealthSnapshot) -> bool:
    """The session ended (a hangup recorded as a deliberate stop) after the trainer's exit was recorded: the session
    ending did not stop it, its death did; the exit record wins. A person's `relaunch stop` (no stopped_how) is recorded
    before its first signal, so before the exit it causes: that stop stands whatever the exit's time."""
    return bool(
        snap.stopped_how and snap.exit_at_epoch is not None and snap.stopped_at is not None and snap.exit_at_epoch < snap.stopped_at
    )


def _foreign_name(line: str) -> str:
    """`123 htop -d 5` as a person reads it: `htop -d 5` (pid 123)."""
    pid, _, command = line.strip().partition(" ")
    return f"`{command.strip()}` (pid {pid})" if pid.isdigit() and command.strip() else f"`{line.strip()}`"


def _gpu_fault(snap: HealthSnapshot, t: Thresholds, metrics: Metrics, gpu_indexes: list[int] | None) -> Diagnosis | None:
    """A failed GPU of the target outranks whatever the trainer printed: its errors are the failure's knock-on."""
    gpu = gpu_fault_evidence(snap, t.expected_gpus, gpu_indexes)
    if gpu:
        return Diagnosis(
            verdict=Verdict.CRASHED, cause=Cause.GPU_FAULT, summary=gpu[0], evidence=[*gpu, *kernel_note(snap)], metrics=metrics
        )
    return None


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


# ---- the trainer is alive --------------------------------------------------------------------
