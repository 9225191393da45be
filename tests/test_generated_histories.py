"""Generated run histories, judged poll by poll exactly as poll_until_settled judges them (advance, then diagnose).

A simulated host (Host) keeps what snapshot.sh would report of one live run at any moment: its log and its own log,
the files its tree writes (checkpoint saves included), its tree's CPU ticks, its py-spy stacks when a poll asks for
them, and its journal (RUN/journal: a `P` line per poll, an `S` line for the step the previous poll of the same check
read). Hypothesis generates the run: how often it steps against the stall floor, how its CPU looks while it steps,
quiet gaps, silent evaluation passes, saves that print nothing but write, where its output goes (stdout, a file of its
own, a pipe that flushes in bursts), a file server's clock skew on every mtime, polls that come late, checks spaced
apart. Properties:

- a healthy run is never STALLED and never stopped: at every poll the remedy is NONE, or the verdict is only watched;
- a hung run (idle, or busy with every stack waiting) is STALLED eventually, and never before its history spans the
  window nor before the window has passed since its last write (a step line, a save)."""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import Phase as Phase_
from hypothesis import strategies as st

from relaunch.config import Thresholds
from relaunch.deciding.playbook import remedy
from relaunch.judging.activity import (
    HANG_CEILING_FACTOR,
    HANG_SAMPLES,
    _stacks_verdict,
    _unreadable,
    read_activity,
    stack_sample,
    typical_step_seconds,
)
from relaunch.judging.alive import run_activity
from relaunch.judging.diagnosis import advance, diagnose
from relaunch.judging.findings import Diagnosis, Progress
from relaunch.judging.snapshot import HealthSnapshot, JournalPoll, JournalStep, OpenWrite
from relaunch.plans.health import parse_journal
from relaunch.vocabulary import Action, Verdict

LAUNCH = 1_700_000_000.0
TAIL_LINES = 20
JOURNAL_LINES = 400  # snapshot.sh sends the journal's last 400 lines
STEP_CHANGES = 40  # ... after its last 40 step changes (snapshot.sh STEP_CHANGES)
FORMATS = (
    "step={k} loss=3.6441 lr=3.96e-04 | (20.0Ktok/s)",
    "Step {k}/1000000 | loss 2.118 | 21.3Ktok/s total",
    "iteration {k} | lm loss: 3.201E+00 | tokens/s 19870",
)
# py-spy stacks by what the tree does. A computing step's innermost frame moves between samples (PLACES, in turn).
PLACES = ("attention (model.py:{n})", "mlp (model.py:{n})", "norm (model.py:{n})", "loss (train.py:{n})", "backward (train.py:{n})")
HEAD = 'Process 4242: python train.py\nPython v3.11.4 (/usr/bin/python3.11)\n\nThread 0x7F01 ({state}): "MainThread"\n'
WAITING_STACKS = {
    "lock": "    acquire (threading.py:320)\n    <module> (train.py:61)\n",
    "nccl": "    all_reduce (torch/distributed/distributed_c10d.py:2050)\n    step (train.py:44)\n",
    "sync": "    synchronize (torch/cuda/__init__.py:801)\n    step (train.py:44)\n",
}


@dataclass(frozen=True)
class Phase:
    """From `start` on (host seconds since launch): CPU in cores, and what its stacks show."""

    start: float
    cores: float
    stacks: str  # "compute", "lock", "nccl", "sync", "spin" (a thread polling while the main one waits on a lock)


@dataclass
class Run:
    """Everything the host would show of one run, as times since launch."""

    output: str  # "stdout", "own" (a file of its own through logging), "pipe" (a buffering pipe into the log)
    log_held: bool  # the tree holds the recorded log open for writing (a redirection, grep's stdout)
    skew: float  # added to every mtime: the file server's clock against the host's
    lines: list[tuple[float, str, str]] = field(default_factory=list)  # (when, "log" | "own", text)
    saves: list[float] = field(default_factory=list)  # when a write into checkpoint_dir happened
    phases: list[Phase] = field(default_factory=list)
    hung_at: float | None = None  # the last step line of a hung run
    attachable: bool = True  # py-spy can read the tree's stacks (else: ptrace refused, as in many containers)
    ends: float = 0.0


class Host:
    """What snapshot.sh reports of a Run at a host time, and the journal its polls leave."""

    def __init__(self, run: Run):
        self.run = run
        self.lines = sorted(run.lines)
        self.line_times = [at for at, _, _ in self.lines]
        self.saves = sorted(run.saves)
        self.phase_starts = [p.start for p in run.phases]
        self.cpu_at = [0.0]
        for a, b in zip(run.phases, run.phases[1:]):
            self.cpu_at.append(self.cpu_at[-1] + a.cores * (b.start - a.start))
        self.journal: list[JournalPoll | JournalStep] = []
        self.samples = 0

    def phase(self, at: float) -> int:
        return max(0, bisect.bisect_right(self.phase_starts, at) - 1)

    def cpu_ticks(self, at: float) -> int:
        i = self.phase(at)
        p = self.run.phases[i]
        return int(100 * (self.cpu_at[i] + p.cores * (at - p.start)))

    def stacks(self, at: float) -> str:
        kind = self.run.phases[self.phase(at)].stacks
        self.samples += 1
        if not self.run.attachable:
            return "=== py-spy dump --pid 4242\nError: Permission Denied: Try running again with elevated permissions\n"
        if kind == "compute":
            place = PLACES[self.samples % len(PLACES)].format(n=20 + 7 * (self.samples % 3))
            return HEAD.format(state="active") + f"    {place}\n    step (train.py:44)\n    <module> (train.py:61)\n"
        if kind == "spin":
            return (
                HEAD.format(state="idle")
                + WAITING_STACKS["lock"]
                + '\nThread 0x7F02 (active): "Thread-1 (poll)"\n    poll (train.py:40)\n    run (threading.py:982)\n'
            )
        return HEAD.format(state="idle" if kind == "lock" else "active") + WAITING_STACKS[kind]

    def snapshot(self, at: float, seen_step: tuple[float, int] | None, want_stacks: bool) -> HealthSnapshot:
        run, now = self.run, LAUNCH + at
        shown = self.lines[: bisect.bisect_right(self.line_times, at)]
        log = [text for _, where, text in shown if where == "log"]
        own = [text for _, where, text in shown if where == "own"]
        log_size = sum(len(x) + 1 for x in log)
        log_written = max((t for t, where, _ in shown if where == "log"), default=0.0)
        own_written = max((t for t, where, _ in shown if where == "own"), default=0.0)
        saves = self.saves[: bisect.bisect_right(self.saves, at)]
        writing = []
        if run.log_held:
            writing.append(OpenWrite(size_bytes=log_size, mtime_epoch=LAUNCH + log_written + run.skew, path="/runs/r1/train.log"))
        if run.output == "own":
            size = sum(len(x) + 1 for x in own)
            writing.append(OpenWrite(size_bytes=size, mtime_epoch=LAUNCH + own_written + run.skew, path="/work/own.log"))
        if saves and at - saves[-1] < 5:  # a save in progress holds its file open
            writing.append(OpenWrite(size_bytes=1000 * len(saves), mtime_epoch=LAUNCH + saves[-1] + run.skew, path="/ckpt/step.pt"))
        ckpt_mtime = LAUNCH + saves[-1] + run.skew if saves else None
        # RUN/journal's lines, as parse_journal reads them; snapshot.sh sends the last JOURNAL_LINES.
        if seen_step is not None:
            self.journal.append(JournalStep(at_epoch=seen_step[0], step=seen_step[1]))
        self.journal.append(
            JournalPoll(
                at_epoch=now,
                cpu_ticks=self.cpu_ticks(at),
                log_size_bytes=log_size,
                written_bytes=sum(w.size_bytes for w in writing),
                written_mtime_epoch=max((w.mtime_epoch for w in writing), default=0.0),
                checkpoint_mtime_epoch=ckpt_mtime,
            )
        )
        sent = self.journal[-JOURNAL_LINES:]
        polls = [x for x in sent if isinstance(x, JournalPoll)]
        # snapshot.sh sends the step changes (its step_changes) ahead of the tail; parse_journal merges them.
        _, steps = parse_journal([f"S {x.at_epoch!r} {x.step}" for x in [*step_changes(self.journal), *sent] if isinstance(x, JournalStep)])
        log_mtime = LAUNCH + log_written + run.skew
        return HealthSnapshot(
            launched=True,
            run_id="r1",
            session_alive=True,
            pid=4242,
            pid_alive=True,
            seconds_since_launch=at,
            seconds_since_log_write=now - log_mtime,
            log_size_bytes=log_size,
            log_tail=log[-TAIL_LINES:],
            log_mtime_epoch=log_mtime,
            host_now_epoch=now,
            tree_pids=[4242],
            tree_cpu_ticks=self.cpu_ticks(at),
            writing=writing,
            own_log="/work/own.log" if run.output == "own" else None,
            own_log_tail=own[-TAIL_LINES:],
            checkpoint_mtime_epoch=ckpt_mtime,
            stacks=self.stacks(at) if want_stacks else None,
            journal=polls,
            journal_steps=steps,
        )


def step_changes(journal: list[JournalPoll | JournalStep]) -> list[JournalStep]:
    """What snapshot.sh's step_changes keeps: the last STEP_CHANGES `S` lines whose step differs from the one before."""
    changes, last = [], None
    for x in journal:
        if isinstance(x, JournalStep):
            if x.step != last:
                changes.append(x)
            last = x.step
    return changes[-STEP_CHANGES:]


@dataclass(frozen=True)
class Poll:
    at: float  # seconds since launch
    diagnosis: Diagnosis
    snapshot: HealthSnapshot
    progress: Progress


@dataclass(frozen=True)
class Schedule:
    thresholds: Thresholds
    first_check: float
    between_checks: tuple[float, ...]  # idle time after each check, in turn
    latencies: tuple[float, ...]  # how late each poll's look comes (a loaded host, a slow link, py-spy), in turn


def polls(run: Run, schedule: Schedule, stop_at_stalled: bool = False) -> list[Poll]:
    """Checks one after another over the run's life, each polling as poll_until_settled does."""
    t = schedule.thresholds
    host, seen, at, n = Host(run), [], schedule.first_check, 0
    if run.hung_at is not None:
        run.ends = run.hung_at + HUNG_WITHIN(t.stall_window_floor_seconds, t)
    while at < run.ends:
        deadline, progress, previous = at + t.settle_timeout_seconds, Progress(), None
        while True:
            if previous is not None:
                at += min(t.poll_interval_seconds, max(0.0, deadline - at))
            at += schedule.latencies[n % len(schedule.latencies)]
            n += 1
            seen_step = None
            if previous is not None and previous[0].metrics.last_step is not None:
                seen_step = (previous[1].host_now_epoch, previous[0].metrics.last_step)
            snap = host.snapshot(at, seen_step, bool(previous and previous[0].want_stacks))
            progress = advance(progress, snap, t)
            d = diagnose(snap, t, progress)
            seen.append(Poll(at, d, snap, progress))
            previous = (d, snap)
            if run.hung_at is not None:  # watched long enough to be called: its window as the judgement learned it
                _, window = run_activity(snap, progress, t, d.metrics.last_step)
                run.ends = max(run.ends, run.hung_at + HUNG_WITHIN(window, t))
            if stop_at_stalled and d.verdict is Verdict.STALLED:
                return seen
            if d.settled or at >= deadline:
                break
        if previous is not None and previous[0].metrics.last_step is not None:  # journal_last_step, as tasks/health.py
            host.journal.append(JournalStep(at_epoch=previous[1].host_now_epoch, step=previous[0].metrics.last_step))
        at += schedule.between_checks[len(seen) % len(schedule.between_checks)]
    return seen


# ---- strategies -----------------------------------------------------------------------------------------------

FLOOR = 30.0


def HUNG_WITHIN(window: float, t: Thresholds) -> float:  # noqa: N802 - a bound, named as the property says it
    """How long after its last step line a hung run must be called stalled: its window (HANG_CEILING_FACTOR of them
    where its stacks cannot be read), a check's full length and a pause between checks on top."""
    return (HANG_CEILING_FACTOR + 1) * window + t.settle_timeout_seconds + 2 * FLOOR


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    interval = draw(st.sampled_from([2.0, 5.0, 8.0]))
    thresholds = Thresholds(
        startup_grace_seconds=draw(st.sampled_from([10.0, 60.0])),
        poll_interval_seconds=interval,
        settle_timeout_seconds=draw(st.sampled_from([4 * FLOOR, 8 * FLOOR])),
        healthy_steps=3,
        stall_window_floor_seconds=FLOOR,
    )
    return Schedule(
        thresholds=thresholds,
        first_check=draw(st.floats(0.0, 3 * FLOOR)),
        between_checks=tuple(draw(st.lists(st.sampled_from([0.0, 1.0, 5.0, FLOOR / 2, 2 * FLOOR]), min_size=1, max_size=4))),
        latencies=tuple(draw(st.lists(st.sampled_from([0.02, 0.2, 1.0, 3.0]), min_size=1, max_size=5))),
    )


@st.composite
def runs(
    draw: st.DrawFn, hung: bool = False, attachable: bool | None = None, hangs: tuple[str, ...] = ("idle", "lock", "nccl", "spin")
) -> Run:
    """A run stepping at a drawn interval against the floor, with quiet gaps, silent evaluations and silent saves
    between its steps; a hung one stops after a drawn step, idle or busy with every stack waiting (one of `hangs`).
    `attachable`: whether py-spy can read its stacks (drawn where None)."""
    attachable = draw(st.sampled_from([True, True, False])) if attachable is None else attachable
    # Where py-spy cannot attach, a busy tree silent for HANG_CEILING_FACTOR windows is called a hang (CPU is then the
    # only evidence, by design): no pipe holds its lines back, and no silence reaches that long.
    output = draw(st.sampled_from(["stdout", "own", "pipe"] if attachable else ["stdout", "own"]))
    run = Run(
        output=output,
        log_held=draw(st.booleans()),
        skew=draw(st.sampled_from([0.0, -3600.0, 7200.0, -0.9, 40.0])),
        attachable=attachable,
    )
    fmt = draw(st.sampled_from(FORMATS))
    # The step interval against the floor; slower than the floor only where the tree computes between the lines.
    interval = FLOOR * draw(st.sampled_from([0.01, 0.05, 0.1, 0.3, 0.7] if hung else [0.01, 0.05, 0.1, 0.3, 0.7, 1.5, 3.0]))
    # Behind a buffering pipe only a computing tree shows it works: the pipe is no file, and RUN/journal does not keep
    # the bytes written into it (tree_wchar), so an idle or GPU-waiting tree behind one shows nothing at all.
    computes = interval > FLOOR or output == "pipe"
    stepping = "compute" if computes else draw(st.sampled_from(["compute", "idle", "sync"]))
    if stepping != "compute":  # idle or GPU-waiting between step lines: its quiet stretches are judged by the floor
        interval = min(interval, 0.3 * FLOOR)
    cores = {"compute": draw(st.sampled_from([0.3, 1.0, 3.5])), "idle": 0.01, "sync": 1.0}[stepping]
    step_stacks = "compute" if stepping == "compute" else "sync" if stepping == "sync" else "lock"
    jitter = draw(st.sampled_from([0.0, 0.1, 0.3]))
    burst = draw(st.integers(2, 40)) if output == "pipe" else 1
    startup = draw(st.floats(0.0, 8.0))
    run.lines.append((0.0, "log", "loading the dataset"))
    run.phases.append(Phase(0.0, 1.0, "compute"))
    run.phases.append(Phase(startup, cores, step_stacks))
    steps = max(6, min(draw(st.integers(8, 30)), int(480 / interval)))  # some minutes of a run: enough polls to judge
    # What comes between two step lines, now and then: (after step, kind, seconds).
    extras = draw(
        st.lists(
            st.tuples(
                st.integers(3, steps - 1),
                st.sampled_from(["gap", "eval", "save"]),
                st.floats(0.5, 8.0),  # a gap: a multiple of the interval; eval and save: of the floor (over 3: capped)
            ),
            max_size=4,
            unique_by=lambda x: x[0],
        )
    )
    extra_at = {k: (kind, x) for k, kind, x in extras}
    at, pending = startup, []
    wobble = draw(st.lists(st.sampled_from([-1.0, 0.0, 1.0]), min_size=1, max_size=7))
    for k in range(1, steps + 1):
        at += interval * (1 + jitter * wobble[k % len(wobble)])
        text = fmt.format(k=k)
        if output == "own":
            run.lines.append((at, "own", text))
        elif output == "pipe":
            pending.append(text)
            if len(pending) >= burst:
                run.lines += [(at, "log", x) for x in pending]
                pending = []
        else:
            run.lines.append((at, "log", text))
        if hung and k == steps:
            break
        if k in extra_at:
            kind, x = extra_at[k]
            if kind == "gap":  # quiet and as the steps are (idle or busy), shorter than 10x the interval: the window
                # a check learns from the step changes journaled by every check before it (journal_last_step, even for
                # checks that settle at their first poll), kept by the host past the journal's tail
                seconds = interval * x
                run.phases.append(Phase(at, cores, step_stacks))
            elif kind == "eval":  # silent, and busy computing
                seconds = FLOOR * min(x, 3.0 if attachable else 2.0)
                run.phases.append(Phase(at, draw(st.sampled_from([0.3, 1.0])), "compute"))
            else:  # a save that prints nothing, its file written every few seconds
                seconds = FLOOR * min(x, 3.0)
                run.phases.append(Phase(at, draw(st.sampled_from([0.01, 0.5])), "compute"))
                every = draw(st.sampled_from([1.0, 4.0, FLOOR / 3]))
                run.saves += [at + i * every for i in range(int(seconds / every) + 1)]
            at += seconds
            run.phases.append(Phase(at, cores, step_stacks))
    if hung:
        run.hung_at = at
        how = draw(st.sampled_from(hangs))
        run.phases.append(Phase(at, {"idle": 0.004, "lock": 0.0, "nccl": 1.0, "spin": 1.0}[how], "lock" if how == "idle" else how))
        run.ends = at
    else:
        run.ends = at
    return run


def described(poll: Poll) -> str:
    return f"at {poll.at:.1f} s: {poll.diagnosis.verdict.value}: {poll.diagnosis.summary} {poll.diagnosis.evidence}"


PROFILE = settings(
    max_examples=15,
    deadline=None,
    database=None,
    derandomize=True,
    # No shrinking in the suite: a failure shows its generated history at once (minutes of shrinking otherwise).
    phases=[Phase_.explicit, Phase_.reuse, Phase_.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@settings(PROFILE, max_examples=40)
@given(run=runs(), schedule=schedules())
def test_a_generated_healthy_run_is_never_stalled_nor_stopped_at_any_poll(run: Run, schedule: Schedule):
    for poll in polls(run, schedule):
        d = poll.diagnosis
        assert d.verdict is not Verdict.STALLED, described(poll)
        assert remedy(d).action is Action.NONE or d.watching, described(poll)


@settings(PROFILE, max_examples=8)  # a hang is watched for its windows: many polls each
@given(run=runs(hung=True), schedule=schedules())
def test_a_generated_hung_run_is_stalled_eventually_and_never_before_its_history_spans_the_window(run: Run, schedule: Schedule):
    seen = polls(run, schedule, stop_at_stalled=True)
    stalled = [p for p in seen if p.diagnosis.verdict is Verdict.STALLED]
    assert stalled, f"never stalled; last: {described(seen[-1]) if seen else 'no poll'}"
    first = stalled[0]
    activity, window = run_activity(first.snapshot, first.progress, schedule.thresholds, first.diagnosis.metrics.last_step)
    assert activity is not None and activity.history_seconds >= window, f"judged on {activity}: {described(first)}"
    # Its last sign of life: the last line that reached a log (a buffering pipe holds the last ones back), or save.
    last_seen = max(x for x in [*(at for at, _, _ in run.lines), *run.saves] if x <= first.at)
    assert first.at - last_seen >= window, f"{first.at - last_seen:.1f} s after its last write: {described(first)}"


@settings(PROFILE, max_examples=6)
@given(run=runs(hung=True, attachable=True, hangs=("nccl",)), schedule=schedules())
def test_a_generated_busy_hang_whose_every_stack_waits_is_stalled_by_its_stacks_long_before_the_ceiling(run: Run, schedule: Schedule):
    # A collective that never returns: the tree spins a core (its CPU alone looks like work) and py-spy reads every
    # thread waiting. Its stacks decide within about a window, never the HANG_CEILING_FACTOR windows kept for a tree
    # whose stacks cannot be read.
    seen = polls(run, schedule, stop_at_stalled=True)
    stalled = [p for p in seen if p.diagnosis.verdict is Verdict.STALLED]
    assert stalled, f"never stalled; last: {described(seen[-1]) if seen else 'no poll'}"
    first, t = stalled[0], schedule.thresholds
    _, window = run_activity(first.snapshot, first.progress, t, first.diagnosis.metrics.last_step)
    assert run.hung_at is not None and first.at - run.hung_at <= 2 * window + t.settle_timeout_seconds + 2 * FLOOR, described(first)
    assert "every thread of every sampled stack waits" in " ".join(first.diagnosis.evidence), described(first)


def stepping_run(interval: float, gap_after: int, gap: float, steps: int = 20) -> Run:
    """A run on stdout stepping every INTERVAL s with its CPU idle (a GPU-bound step), quiet for GAP s after one step."""
    run = Run(output="stdout", log_held=True, skew=0.0, phases=[Phase(0.0, 0.01, "lock")])
    at = 0.0
    for k in range(1, steps + 1):
        at += interval + (gap if k == gap_after + 1 else 0.0)
        run.lines.append((at, "log", FORMATS[0].format(k=k)))
    run.ends = at
    return run


def test_a_quiet_gap_longer_than_the_floor_but_shorter_than_ten_intervals_is_no_stall_across_checks():
    # Steps every 9 s (a 90 s window by 10x), then 80 s of quiet; first looked at once stepping, then a check every 5 s,
    # each settled at its first look.
    schedule = Schedule(
        thresholds=Thresholds(
            startup_grace_seconds=10, poll_interval_seconds=5, settle_timeout_seconds=240, stall_window_floor_seconds=FLOOR
        ),
        first_check=40.0,
        between_checks=(5.0,),
        latencies=(0.2,),
    )
    for poll in polls(stepping_run(9.0, 10, 80.0), schedule):
        assert poll.diagnosis.verdict is not Verdict.STALLED, described(poll)


@given(steps=st.integers(8, 40), late=st.floats(0.1, 0.45), every=st.sampled_from([0.5, 2.0, 9.0]), cycle=st.integers(3, 6))
def test_sightings_each_less_late_than_the_last_never_shorten_the_runs_step_interval(steps, late, every, cycle):
    # Seen in CI under load (2026-12-04, make test beside 2 CPU hogs): steps every 0.5 s and checks back to back, each
    # poll a little less late than the one before (a host whose load ebbs), then late again: most intervals between
    # two sightings read short, their median 0.4 s, and a 4 s quiet gap (8 intervals) was called stalled on a 4 s
    # window. The run's rate over the span is not fooled: only the span's two ends carry a poll's lateness.
    lag = [late * every * (1 - (k % cycle) / cycle) for k in range(steps)]  # a sawtooth: less late each poll, then late
    seen = [JournalStep(at_epoch=LAUNCH + k * every + lag[k], step=k) for k in range(1, steps)]
    journal = [
        JournalPoll(at_epoch=s.at_epoch, cpu_ticks=0, log_size_bytes=k, written_bytes=0, written_mtime_epoch=0.0)
        for k, s in enumerate(seen)
    ]
    snap = HealthSnapshot(launched=True, pid_alive=True, host_now_epoch=seen[-1].at_epoch, journal=journal, journal_steps=seen)
    activity = read_activity(snap, steps - 1, FLOOR)
    assert activity is not None and statistics.median(activity.per_step_seconds) < every, "the shape: sightings read short"
    # The span's ends are late by at most `late` of an interval each: over steps - 2 intervals, that much of one.
    assert typical_step_seconds(activity, ()) >= every * (1 - late / (steps - 2)) * (1 - 1e-9), activity


def test_the_same_gap_is_no_stall_where_the_checks_watch_the_steps_advance():
    # The control: the first check comes during the start-up, polls until the third step line and journals the steps it
    # read between its polls: the 90 s window is learned and kept in RUN/journal for the checks after.
    schedule = Schedule(
        thresholds=Thresholds(
            startup_grace_seconds=10, poll_interval_seconds=5, settle_timeout_seconds=240, stall_window_floor_seconds=FLOOR
        ),
        first_check=5.0,
        between_checks=(5.0,),
        latencies=(0.2,),
    )
    run = stepping_run(9.0, 10, 80.0)
    seen = polls(run, schedule)
    assert all(p.diagnosis.verdict is not Verdict.STALLED for p in seen)


def test_dumps_in_which_py_spy_read_no_thread_are_no_samples_of_one_spinning_place():
    # ptrace refused: six dumps of nothing once read as six samples of one and the same place, a spin, so a hang.
    denied = stack_sample("=== py-spy dump --pid 4242\nError: Permission Denied: Try running again with elevated permissions\n")
    samples = tuple((LAUNCH + i, *denied) for i in range(8))
    assert _stacks_verdict(samples, LAUNCH) is None
    assert _unreadable(samples, LAUNCH)


def test_a_busy_tree_quiet_for_many_windows_is_sampled_before_it_is_judged_and_called_only_once_its_stacks_fail():
    # Behind a pipe that never flushed, computing for 8 windows, py-spy refused: checks a window apart, each of 30 s.
    run = Run(output="pipe", log_held=False, skew=0.0, attachable=False, phases=[Phase(0.0, 1.0, "compute")])
    run.lines.append((0.0, "log", "loading the dataset"))
    run.ends = 8 * FLOOR
    t = Thresholds(startup_grace_seconds=10, poll_interval_seconds=5, settle_timeout_seconds=FLOOR, stall_window_floor_seconds=FLOOR)
    seen = polls(run, Schedule(thresholds=t, first_check=15, between_checks=(FLOOR,), latencies=(0.2,)), stop_at_stalled=True)
    firsts = [p for p in seen if p.progress.polls == 1]
    assert len(firsts) > 3 and not any(p.diagnosis.verdict is Verdict.STALLED for p in firsts), [described(p) for p in firsts]
    # Called at last, HANG_CEILING_FACTOR windows on, once this check asked for its stacks and could read none.
    assert seen[-1].diagnosis.verdict is Verdict.STALLED, described(seen[-1])
    assert len(seen[-1].progress.stack_samples) >= HANG_SAMPLES, seen[-1].progress.stack_samples


def test_a_run_that_computed_through_a_silent_evaluation_and_now_waits_on_its_gpu_is_no_hang_until_a_window_passes():
    # Found by the generator: GPU-bound steps every 8 s (the tree idle, its stacks waiting; an 80 s window), a silent
    # 100 s evaluation on the CPU after step 11, then GPU-bound steps again. A check begun late in the evaluation samples stacks that wait
    # (the steps again) over a window whose CPU was the evaluation's: quiet counts from when the work ended.
    run = Run(output="own", log_held=True, skew=-0.9, phases=[Phase(0.0, 1.0, "compute"), Phase(1.8, 0.01, "lock")])
    run.lines.append((0.0, "log", "loading the dataset"))
    at = 1.8
    for k in range(1, 30):
        at += 8.0
        run.lines.append((at, "own", FORMATS[1].format(k=k)))
        if k == 11:
            run.phases += [Phase(at, 0.3, "compute"), Phase(at + 100.0, 0.01, "lock")]
            at += 110.0
    run.ends = at
    t = Thresholds(startup_grace_seconds=10, poll_interval_seconds=2, settle_timeout_seconds=120, stall_window_floor_seconds=FLOOR)
    schedule = Schedule(thresholds=t, first_check=22.6, between_checks=(15.0, 5.0, 15.0), latencies=(1.0, 1.0, 0.2, 3.0, 3.0))
    seen = polls(run, schedule)
    for poll in seen:
        assert poll.diagnosis.verdict is not Verdict.STALLED, described(poll)
    assert any(p.diagnosis.watching and "work ended" in p.diagnosis.watching for p in seen), "the case this holds was not reached"
