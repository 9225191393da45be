"""Goodput: where a target's time went, per night and in total, from relaunch's own timeline. Pure: no I/O, no Prefect.

The timeline is what relaunch already records: each health check's verdict with what it saw of the run's step lines
(relaunch.verdict.* events), each recovery step's start and end (task runs), each escalation. Every second of the
window gets exactly one category; where two could claim it, the first in PRIORITY does. The categories, and how to
read them: docs/goodput.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, Field

from relaunch.deciding.checkpoints import step_of
from relaunch.judging.findings import Diagnosis, Progress
from relaunch.judging.snapshot import HealthSnapshot
from relaunch.vocabulary import Category, Step, Verdict

# A trainer's recorded start (the host's clock) may fall this long after its launch step began and be the same launch;
# and the launch step may spend this long (listing checkpoints, over a slow link) before it starts the trainer.
LAUNCH_SLACK = timedelta(seconds=5)
LAUNCH_LEAD = timedelta(minutes=10)


# Who owns a second that two intervals claim: the redone steps out of the productive ones, and a run still stepping
# while relaunch builds its next venv beside it is productive, not rebuild time.
PRIORITY: tuple[Category, ...] = (
    Category.WASTED,
    Category.PRODUCTIVE,
    Category.STOP,
    Category.REBUILD,
    Category.WARM_UP,
    Category.LAUNCH,
    Category.DETECTION,
    Category.ESCALATED,
    Category.START_UP,
    Category.RECOVERY_OTHER,
)


class Observation(BaseModel):
    """What one health check saw of one run: a relaunch.verdict.* event and the facts it carries."""

    at: datetime = Field(description="When the verdict was reached (the event's time, the control plane's clock).")
    verdict: Verdict
    run_id: str | None = Field(None, description="The run judged (None: no run on record).")
    seconds_since_launch: float | None = Field(None, description="The run's age at the verdict, by the host's clock.")
    first_step_seconds: float | None = Field(
        None, description="Seconds after the launch of the first step line, where this check saw it come."
    )
    last_step_seconds: float | None = Field(None, description="Seconds after the launch of the last step line seen.")
    first_step: int | None = Field(None, description="The step number of that first step line.")
    last_step: int | None = Field(None, description="The highest step number seen.")
    seconds_per_step: float | None = Field(None, description="The median time between step lines this check measured.")
    resumed_from_step: int | None = Field(None, description="The step of the checkpoint the run was launched with (None: from scratch).")


def observe(diagnosis: Diagnosis, snap: HealthSnapshot, progress: Progress, at: datetime) -> Observation:
    """What one health check tells goodput; its verdict event carries the same (payload: `payload_of`)."""
    intervals = sorted(progress.step_intervals)
    checkpoint = snap.checkpoint.rstrip("/").rsplit("/", 1)[-1] if snap.checkpoint else None
    return Observation(
        at=at,
        verdict=diagnosis.verdict,
        run_id=snap.run_id,
        seconds_since_launch=snap.seconds_since_launch,
        first_step_seconds=progress.first_step_at,
        last_step_seconds=progress.step_changed_at,
        first_step=progress.first_step,
        last_step=diagnosis.metrics.last_step,
        seconds_per_step=intervals[len(intervals) // 2] if intervals else None,
        resumed_from_step=step_of(checkpoint) if checkpoint else None,
    )


def payload_of(observation: Observation) -> dict[str, object]:
    """The observation's facts as a verdict event's payload (its time and verdict are the event's own)."""
    return observation.model_dump(mode="json", exclude={"at", "verdict"})


def from_event(occurred: datetime, event: str, payload: dict[str, object]) -> Observation | None:
    """The observation a `relaunch.verdict.<verdict>` event records; None for an event of no known verdict."""
    try:
        verdict = Verdict(event.rsplit(".", 1)[-1])
    except ValueError:
        return None
    known = {k: v for k, v in payload.items() if k in Observation.model_fields and k not in ("at", "verdict")}
    return Observation(at=occurred, verdict=verdict, **known)


class StepSpan(BaseModel):
    """One recovery step's task run."""

    step: Step
    started_at: datetime
    ended_at: datetime


class Timeline(BaseModel):
    target: str
    observations: list[Observation] = Field(default_factory=list)
    steps: list[StepSpan] = Field(default_factory=list)
    escalations: list[datetime] = Field(default_factory=list, description="When a recovery escalated to a person.")


class Segment(BaseModel):
    category: Category
    start: datetime
    end: datetime

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


class Night(BaseModel):
    """One UTC day of the window (or the whole window: night == 'total')."""

    night: str = Field(description="The UTC date (YYYY-MM-DD), or 'total'.")
    seconds: dict[Category, float] = Field(default_factory=dict, description="Seconds of each category.")

    @property
    def window_seconds(self) -> float:
        return sum(self.seconds.values())

    @property
    def goodput_percent(self) -> float:
        total = self.window_seconds
        return 100.0 * self.seconds.get(Category.PRODUCTIVE, 0.0) / total if total else 0.0


class Goodput(BaseModel):
    target: str
    window_start: datetime
    window_end: datetime
    nights: list[Night] = Field(default_factory=list)
    total: Night
    segments: list[Segment] = Field(default_factory=list, description="The window cut into categories, in time order.")


class _Run(BaseModel):
    run_id: str
    launched_at: datetime
    observations: list[Observation]
    first_step_at: datetime | None = None
    last_step_at: datetime | None = None
    start_step: int = 0
    last_step: int | None = None
    seconds_per_step: float | None = None
    resumed_from_step: int | None = None


def compute(timeline: Timeline, start: datetime, end: datetime) -> Goodput:
    """The window [start, end) cut into categories, and the seconds of each, per UTC night and in total."""
    claims = _claims(timeline, end)
    segments = _sweep(claims, start, end)
    return Goodput(
        target=timeline.target,
        window_start=start,
        window_end=end,
        nights=_nights(segments),
        total=_night("total", segments),
        segments=segments,
    )


def report(timeline: Timeline, days: float, now: datetime) -> Goodput:
    """The last `days` up to `now`, from the first thing relaunch recorded when that is later: a target set up
    yesterday is not counted as not running all week."""
    earliest = [r.launched_at for r in _runs(timeline)] + [s.started_at for s in timeline.steps] + [o.at for o in timeline.observations]
    start = max(now - timedelta(days=days), min(earliest, default=now))
    return compute(timeline, start, now)


def _runs(timeline: Timeline) -> list[_Run]:
    by_run: dict[str, list[Observation]] = defaultdict(list)
    for o in sorted(timeline.observations, key=lambda o: o.at):
        if o.run_id and o.seconds_since_launch is not None:
            by_run[o.run_id].append(o)
    runs = []
    for run_id, seen in by_run.items():
        launched = min(o.at - timedelta(seconds=o.seconds_since_launch or 0.0) for o in seen)
        run = _Run(run_id=run_id, launched_at=launched, observations=seen)
        firsts = [o for o in seen if o.first_step_seconds is not None]
        if firsts:
            run.first_step_at = launched + timedelta(seconds=firsts[0].first_step_seconds or 0.0)
            run.start_step = max(0, (firsts[0].first_step or 1) - 1)
        lasts = [o for o in seen if o.last_step_seconds is not None]
        if lasts:
            run.last_step_at = max(launched + timedelta(seconds=o.last_step_seconds or 0.0) for o in lasts)
            run.last_step = (
                max(o.last_step for o in lasts if o.last_step is not None) if any(o.last_step is not None for o in lasts) else None
            )
        run.resumed_from_step = next((o.resumed_from_step for o in seen if o.resumed_from_step is not None), None)
        if run.resumed_from_step is not None and not firsts:
            run.start_step = run.resumed_from_step
        rates = [o.seconds_per_step for o in seen if o.seconds_per_step]
        run.seconds_per_step = rates[-1] if rates else _rate_between(lasts) or _rate(run)
        runs.append(run)
    return sorted(runs, key=lambda r: r.launched_at)


def _rate_between(seen: list[Observation]) -> float | None:
    """Seconds per step from the first and last step lines two checks saw (a night apart, or a death apart)."""
    known = sorted((o.last_step_seconds or 0.0, o.last_step) for o in seen if o.last_step is not None)
    if len(known) < 2 or known[-1][1] <= known[0][1]:  # type: ignore[operator]
        return None
    return (known[-1][0] - known[0][0]) / (known[-1][1] - known[0][1])  # type: ignore[operator]


def _rate(run: _Run) -> float | None:
    """Seconds per step from the run's first and last step lines, where no check measured it."""
    if run.first_step_at is None or run.last_step_at is None or run.last_step is None or run.last_step <= run.start_step + 1:
        return None
    return (run.last_step_at - run.first_step_at).total_seconds() / (run.last_step - run.start_step - 1)


def _claims(timeline: Timeline, end: datetime) -> dict[Category, list[tuple[datetime, datetime]]]:
    claims: dict[Category, list[tuple[datetime, datetime]]] = defaultdict(list)
    steps = sorted(timeline.steps, key=lambda s: s.started_at)
    for s in steps:
        claims[s.step.category].append((s.started_at, s.ended_at))
    launches = [s for s in steps if s.step is Step.LAUNCH]
    stops = [s.started_at for s in steps if s.step is Step.STOP]
    runs = _runs(timeline)
    for index, run in enumerate(runs):
        later = runs[index + 1] if index + 1 < len(runs) else None
        last_seen = run.observations[-1]
        stepping_end = run.last_step_at
        if last_seen.verdict is Verdict.HEALTHY:
            # Seen healthy last: taken to have stepped on until something ended it (a stop, the next launch) or the window did.
            ends = [t for t in stops if t > last_seen.at] + ([later.launched_at] if later else []) + [end]
            stepping_end = min(ends)
        if stepping_end is None:
            continue
        begin = run.first_step_at or run.launched_at
        if run.first_step_at is not None:
            # From the launch step's start: the step's own time is the launch's by priority, the rest start-up.
            launch = [s.started_at for s in launches if run.launched_at - LAUNCH_LEAD <= s.started_at <= run.launched_at + LAUNCH_SLACK]
            claims[Category.START_UP].append((max(launch, default=run.launched_at), run.first_step_at))
        claims[Category.PRODUCTIVE].append((begin, stepping_end))
        # The next run's start says which steps were kept: its checkpoint's, or the one before its first step line. A run
        # started by hand from who knows where (neither known) redid nothing relaunch can tell.
        resumed = later.resumed_from_step if later is not None else None
        if later is not None and resumed is None and later.first_step_at is not None:
            resumed = later.start_step
        if resumed is not None and run.last_step is not None and run.seconds_per_step:
            kept = max(resumed, run.start_step)
            redone = max(0, run.last_step - kept) * run.seconds_per_step
            claims[Category.WASTED].append((max(begin, stepping_end - timedelta(seconds=redone)), stepping_end))
        sick = next((o for o in run.observations if o.at >= stepping_end and not o.verdict.is_fine()), None)
        if sick is not None and last_seen.verdict is not Verdict.HEALTHY:
            claims[Category.DETECTION].append((stepping_end, sick.at))
            # The recovery it started: until its launch ends (or its last step, when it launched nothing).
            after = [s for s in launches if s.started_at >= sick.at]
            done = after[0].ended_at if after else max((s.ended_at for s in steps if s.started_at >= sick.at), default=sick.at)
            claims[Category.RECOVERY_OTHER].append((sick.at, done))
    healthy = [o.at for o in timeline.observations if o.verdict is Verdict.HEALTHY]
    for at in timeline.escalations:
        resolved = [s.started_at for s in launches if s.started_at > at] + [t for t in healthy if t > at] + [end]
        claims[Category.ESCALATED].append((at, min(resolved)))
    return claims


def _sweep(claims: dict[Category, list[tuple[datetime, datetime]]], start: datetime, end: datetime) -> list[Segment]:
    cuts = {start, end}
    for spans in claims.values():
        for a, b in spans:
            cuts.update(t for t in (a, b) if start < t < end)
    midnights, day = set(), datetime(start.year, start.month, start.day, tzinfo=start.tzinfo or UTC) + timedelta(days=1)
    while day < end:  # a segment never spans two nights
        midnights.add(day)
        day += timedelta(days=1)
    cuts |= midnights
    points = sorted(cuts)
    segments: list[Segment] = []
    for a, b in zip(points, points[1:]):
        middle = a + (b - a) / 2
        category = next(
            (c for c in PRIORITY if any(lo <= middle < hi for lo, hi in claims.get(c, ()))),
            Category.NOT_RUNNING,
        )
        if segments and segments[-1].category is category and segments[-1].end == a and a not in midnights:
            segments[-1] = segments[-1].model_copy(update={"end": b})
        else:
            segments.append(Segment(category=category, start=a, end=b))
    return segments


def _night(name: str, segments: Iterable[Segment]) -> Night:
    seconds = dict.fromkeys(Category, 0.0)
    for s in segments:
        seconds[s.category] += s.seconds
    return Night(night=name, seconds=seconds)


def _nights(segments: list[Segment]) -> list[Night]:
    by_day: dict[str, list[Segment]] = defaultdict(list)
    for s in segments:
        by_day[s.start.astimezone(UTC).date().isoformat()].append(s)
    return [_night(day, by_day[day]) for day in sorted(by_day)]


def table(goodput: Goodput) -> list[dict[str, object]]:
    """The rows of the goodput table artifact: one per night and a total, minutes per category."""
    rows = []
    for night in [*goodput.nights, goodput.total]:
        row: dict[str, object] = {"night": night.night, "goodput_percent": round(night.goodput_percent, 1)}
        row["window_minutes"] = round(night.window_seconds / 60, 2)
        row.update({f"{c.value}_minutes": round(night.seconds.get(c, 0.0) / 60, 2) for c in Category})
        rows.append(row)
    return rows


def trend_markdown(goodput: Goodput) -> str:
    """Goodput night by night, and where the lost time went: the markdown trend artifact."""
    lines = [
        f"# Goodput of {goodput.target}",
        "",
        f"{goodput.window_start:%Y-%m-%d %H:%M} to {goodput.window_end:%Y-%m-%d %H:%M} UTC: "
        f"**{goodput.total.goodput_percent:.1f}%** productive. How to read it: docs/goodput.md.",
        "",
        "| night | goodput | productive h | lost h | biggest loss |",
        "| --- | --- | --- | --- | --- |",
    ]
    for n in [*goodput.nights, goodput.total]:
        lost = {c: s for c, s in n.seconds.items() if c is not Category.PRODUCTIVE}
        worst = max(lost, key=lambda c: lost[c]) if any(lost.values()) else None
        bar = "█" * round(n.goodput_percent / 10)
        lines.append(
            f"| {n.night} | {bar} {n.goodput_percent:.1f}% | {n.seconds.get(Category.PRODUCTIVE, 0.0) / 3600:.2f} | "
            f"{sum(lost.values()) / 3600:.2f} | {f'{worst.value} ({lost[worst] / 3600:.2f} h)' if worst else '-'} |"
        )
    return "\n".join(lines)


def text_table(goodput: Goodput) -> str:
    """`relaunch goodput`'s table: one line per night and the total, minutes of every category any night has."""
    if not goodput.segments:
        return (
            f"nothing recorded about {goodput.target} up to {goodput.window_end:%Y-%m-%d %H:%M} UTC: no health check of it "
            "reported a verdict to this Prefect API (is PREFECT_API_URL the server its checks ran on, and the name the target's?)"
        )
    nights = [*goodput.nights, goodput.total]
    shown = [c for c in Category if goodput.total.seconds.get(c, 0.0) > 0] or [Category.NOT_RUNNING]
    head = f"{'night':<10} {'goodput':>8} " + " ".join(f"{c.value:>{max(9, len(c.value))}}" for c in shown)
    lines = [
        f"goodput of {goodput.target}, {goodput.window_start:%Y-%m-%d %H:%M} to {goodput.window_end:%Y-%m-%d %H:%M} UTC (minutes)",
        head,
    ]
    for n in nights:
        cells = " ".join(f"{n.seconds.get(c, 0.0) / 60:>{max(9, len(c.value))}.1f}" for c in shown)
        lines.append(f"{n.night:<10} {n.goodput_percent:>7.1f}% {cells}")
    return "\n".join(lines)
