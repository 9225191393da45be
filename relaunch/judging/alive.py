"""A run whose trainer lives: starting, healthy, stalled, slow or diverged, judged from its own history and its processes' work, never from one look. Pure."""

from __future__ import annotations

import statistics

from relaunch.config import Thresholds
from relaunch.judging.activity import HANG_CEILING_FACTOR, Activity, read_activity, typical_step_seconds
from relaunch.judging.findings import Diagnosis, Metrics, Progress, last_log_lines, run_pids
from relaunch.judging.progress import Motion, Reading, read_progress
from relaunch.judging.reading import diverged, read_log, slow_throughput, step_reader
from relaunch.judging.signatures import SLOWDOWN_WARNINGS
from relaunch.judging.snapshot import HealthSnapshot
from relaunch.vocabulary import Cause, Verdict


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


def _record_verdict(
    reading: Reading, activity: Activity | None, window: float, metrics: Metrics, what: str, evidence: list[str]
) -> Diagnosis | None:
    """The progress record's say on a quiet run (relaunch/judging/progress.py), None where it is not quiet.

    Working, whatever its stacks say: a frame alone is never a hang. Flat for the window: stalled. Waiting on something
    alive outside it: stalled, cause blocked, escalated and never stopped. A busy GPU over a still host: its stacks
    decide, sampled over the window as before."""
    holding = Verdict.HEALTHY if metrics.steps_seen else Verdict.STARTING
    facts = list(reading.evidence)
    if reading.motion is Motion.WORKING:
        return None
    if reading.motion is Motion.WATCHING:
        return Diagnosis(
            verdict=holding,
            summary=f"quiet; watching it for its {window:.0f} s stall window ({reading.spans_seconds:.0f} s recorded)",
            evidence=[*facts, *evidence],
            metrics=metrics,
            watching=f"the stall window: {reading.spans_seconds:.0f} of {window:.0f} s",
        )
    if reading.motion is Motion.FLAT:
        return Diagnosis(
            verdict=Verdict.STALLED,
            summary=f"no new {what}, and nothing in its tree moved for {reading.quiet_seconds:.0f} s (a hang)",
            evidence=[*facts, *evidence],
            metrics=metrics,
        )
    if reading.motion is Motion.BLOCKED:
        return Diagnosis(
            verdict=Verdict.STALLED,
            cause=Cause.BLOCKED,
            summary=f"no new {what} for {reading.quiet_seconds:.0f} s: it waits on something alive outside its tree",
            evidence=[*facts, *evidence],
            metrics=metrics,
        )
    # GPU_SPIN: the stacks sampled since the host went still decide.
    if activity is not None and activity.stacks_waiting:
        return Diagnosis(
            verdict=Verdict.STALLED,
            summary=f"no new {what} for {reading.quiet_seconds:.0f} s: its GPUs spin while every stack waits (a hang)",
            evidence=[*facts, "every thread of every sampled stack waits (a collective, a synchronize, a barrier, a lock)", *evidence],
            metrics=metrics,
        )
    if activity is not None and activity.stacks_waiting is False:
        return None  # its stacks compute: one long kernel, not a hang
    if activity is not None and activity.stacks_unreadable and reading.quiet_seconds >= HANG_CEILING_FACTOR * window:
        return Diagnosis(
            verdict=Verdict.STALLED,
            summary=f"no new {what} for {reading.quiet_seconds:.0f} s though its GPUs are busy",
            evidence=[*facts, f"{HANG_CEILING_FACTOR:.0f} stall windows", "its stacks could not be sampled (py-spy)", *evidence],
            metrics=metrics,
        )
    return Diagnosis(
        verdict=holding,
        summary=f"quiet for {reading.quiet_seconds:.0f} s with its GPUs busy: sampling its stacks",
        evidence=[*facts, "computing, or spinning in a hang? its stacks decide", *evidence],
        metrics=metrics,
        watching="the tree's stacks",
        want_stacks=True,
    )


def record_reading(snap: HealthSnapshot, t: Thresholds, window: float, gpu_indexes: list[int] | None) -> Reading | None:
    """The progress record's reading of the window (None: the poll sent no record: the trainer is not alive)."""
    if not snap.progress:
        return None
    return read_progress(snap.progress, window, t.progress_sample_seconds, gpu_indexes)


def _paused(reading: Reading | None, metrics: Metrics, evidence: list[str]) -> Diagnosis | None:
    if reading is None or reading.motion is not Motion.PAUSED:
        return None
    who = ", ".join(f"PID {pid}" for pid in reading.pids[:4])
    return Diagnosis(
        verdict=Verdict.PAUSED,
        summary=f"paused by a person ({who} stopped by a signal): left as it is",
        evidence=[*reading.evidence, *evidence],
        metrics=metrics,
    )


def judge_alive(snap: HealthSnapshot, t: Thresholds, p: Progress, metrics: Metrics, gpu_indexes: list[int] | None = None) -> Diagnosis:
    now = snap.seconds_since_launch or 0.0
    gpu_evidence = _gpu_evidence(snap, t, p, gpu_indexes)
    activity, window = run_activity(snap, p, t, metrics.last_step)
    reading = record_reading(snap, t, window if metrics.steps_seen else t.stall_window_floor_seconds, gpu_indexes)
    pause = _paused(reading, metrics, [*last_log_lines(snap, 1), *gpu_evidence])
    if pause is not None:
        return pause
    if metrics.steps_seen == 0:
        return _starting_or_stalled(snap, t, p, metrics, gpu_evidence, activity, reading)
    stepped_at = p.step_changed_at if p.step_changed_at is not None else now
    since_step = now - stepped_at
    # A checkpoint written since the last step line, within the window, is a save in progress (a long torch.save
    # prints nothing): killing it mid-save leaves a half-written checkpoint to resume from.
    saved = p.checkpoint_written_at
    saving = saved is not None and saved > stepped_at and now - saved < window
    stepped = activity is not None and activity.since_step_seconds is not None and activity.since_step_seconds < window
    if reading is not None and reading.motion is not Motion.NO_RECORD and not stepped:
        # The progress record decides (RUN/progress): what the whole tree did over the window, however long ago the
        # quiet began; a step the journal saw advance within the window is progress whatever else stood still.
        ev = [f"last step line: {_last_step_line(snap, t)}", *gpu_evidence]
        quiet = _record_verdict(reading, activity, window, metrics, "step", ev)
        if quiet is not None:
            return quiet
    elif activity is not None:
        # The run's own history decides (RUN/journal): step advances, writes and CPU between polls, never one look.
        ev = [*(reading.evidence if reading is not None else ()), f"last step line: {_last_step_line(snap, t)}", *gpu_evidence]
        quiet = _quiet_verdict(snap, activity, window, metrics, "new step", ev)
        if quiet is not None:
            return quiet
    elif reading is None and since_step >= window and (snap.seconds_since_log_write or 0) >= min(window, since_step) and not saving:
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
    snap: HealthSnapshot,
    t: Thresholds,
    p: Progress,
    metrics: Metrics,
    gpu_evidence: list[str],
    activity: Activity | None = None,
    reading: Reading | None = None,
) -> Diagnosis:
    now = snap.seconds_since_launch or 0.0
    if reading is not None and reading.motion is not Motion.NO_RECORD and now >= t.startup_grace_seconds:
        # Past its grace, a start-up is judged by what its whole tree did over the window, as a stepping run is.
        quiet = _record_verdict(
            reading, activity, t.stall_window_floor_seconds, metrics, "step line", [*last_log_lines(snap, 1), *gpu_evidence]
        )
        if quiet is not None:
            return quiet
        return Diagnosis(
            verdict=Verdict.STARTING,
            summary=f"starting for {now:.0f} s",
            evidence=[
                f"start-up is past its {t.startup_grace_seconds:.0f} s grace but still progressing",
                *reading.evidence,
                *gpu_evidence,
            ],
            metrics=metrics,
        )
    if activity is not None and now >= t.startup_grace_seconds:
        # Past its grace, a start-up is judged as a stepping run is: by what its processes did over the window.
        quiet = _quiet_verdict(
            snap, activity, t.stall_window_floor_seconds, metrics, "step line", [*last_log_lines(snap, 1), *gpu_evidence]
        )
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
                *last_log_lines(snap, 1),
                *gpu_evidence,
            ],
            metrics=metrics,
        )
    # A checkpoint written counts as the log growing does (a save before the first step: step 0's).
    last_progress = max(x for x in (p.log_grew_at, p.gpu_rose_at, p.checkpoint_written_at, 0.0) if x is not None)
    quiet = min(now - last_progress, snap.seconds_since_log_write if snap.seconds_since_log_write is not None else now)
    tail = last_log_lines(snap, 1)
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
    tree = run_pids(snap)
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


def _last_step_line(snap: HealthSnapshot, t: Thresholds) -> str:
    step_of = step_reader(t)
    return next((line.rstrip() for line in reversed(snap.log_tail) if step_of(line) is not None), "")


def _dedupe(lines: list[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in lines if not (x in seen or seen.add(x))]
