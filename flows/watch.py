"""`relaunch watch`: a death is handed to recover-training the round it is seen, instead of at the next nightly check.

One loop over every watched target (a host is reached through its one shared connection, relaunch.wire.transport), every
`interval_seconds`: a cheap look each (relaunch/host/pulse.sh, relaunch/judging/watching.py), all hosts of a round at once.
`run` keeps one look out per target, held on its host while the trainer lives (pulse.sh returns the moment the
trainer's exit is recorded), and judges each look as it comes back: a death is handed over within a nap of it,
whatever the interval. A host slow to answer (one that hangs until its connect timeout) holds only its own look.
The watch itself stops nothing and judges nothing: a death it sees starts the recover-training flow, whose full check,
locks and never-harm rules decide what happens, exactly as for `relaunch recover`. What it sees is also a Prefect
event (`relaunch.trainer.died`, `relaunch.host.unreachable`), for the UI and for automations.

A death is never lost to the Prefect API: a handover the API cannot take (the record of it, or the recovery, failing
because the API does not answer) is retried with backoff until it answers, said once per death. A target stopped on
purpose is never relaunched by a recovery the watch started (recover_training's `handed_over`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import httpx
from prefect import flow
from pydantic import Field

from relaunch.config import Target, load_targets
from relaunch.deciding.incidents import Sick, incidents
from relaunch.errors import RelaunchError
from relaunch.flows.fleet import announce_incident
from relaunch.flows.outcome import emit, report_of, run_tags
from relaunch.flows.recover import recover_training
from relaunch.judging.watching import Pulse, Seen, hand_over, seen, stillness
from relaunch.plans.watch import parse_pulse, plan_pulse
from relaunch.records.report import Report
from relaunch.tasks.memory import read_handed, write_handed
from relaunch.wire.transport import run, transport_for

# As the fleet's default: hosts that stopped answering within this many minutes of each other are one incident.
INCIDENT_WINDOW_MINUTES = 10.0
# A handover the Prefect API could not take is tried again after this long, the wait doubling up to the cap: a server
# restart (seconds) is caught within seconds, an outage of hours costs one request a minute.
RETRY_FIRST_SECONDS = 2.0
RETRY_MAX_SECONDS = 60.0


@dataclass
class Owed:
    """A death seen and not yet handed over for good: its recovery has not started, or the API failed it."""

    pulse: Pulse
    recorded: bool = False  # the handover is in its Prefect Variable, or the API answered a refusal: not written again
    delay: float = RETRY_FIRST_SECONDS  # the wait before the next try, once one failed
    due: float = 0.0  # when it is tried again (monotonic)
    said: bool = False  # that the API does not answer was said, for this death


@dataclass
class HangHanded:
    """A live run handed over as hung: not handed over again before `due` (the wait doubling each time, while the
    recovery's full check finds it is no hang: a long quiet wait the wider window allows, a GPU computing)."""

    run_id: str
    due: float  # monotonic
    delay: float


@dataclass
class Watched:
    """One target as the watch keeps it between rounds."""

    target: Target
    source: Path | None  # None: given as a target (the watch deployment's parameter), never re-read
    handled: str | None = None  # the run whose death was last handed over
    unreachable: str | None = None  # why the last look failed, while it keeps failing (said once)
    recovery: Future[Report] | None = None
    looking: Future[Pulse] | None = None  # the look still out (a host slow to answer keeps it across rounds)
    slow: bool = False  # that it is slow was said, for this look
    unreachable_since: datetime | None = None  # when its look first failed, this streak
    looked_at: float = 0.0  # when the look out (or the last) was sent (monotonic)
    looks: int = 0  # looks judged
    last: Seen | None = None
    owed: Owed | None = None  # a death whose handover is not done yet (retried while the API does not answer)
    hang: HangHanded | None = None  # the live run last handed over as hung


def look(target: Target, hold_seconds: float = 0.0) -> Pulse:
    return parse_pulse(run(transport_for(target.host), plan_pulse(target, hold_seconds)).stdout)


def _recover(target: Target) -> Report:
    """The recovery as `relaunch recover` runs it, handed over: a target found stopped on purpose is left stopped (the
    death the watch saw was the stop's own, or a person stopped it since). Tagged with its target and host, its report
    whether it Completed or ended Failed (an escalation)."""
    from prefect import tags

    with tags(*run_tags(target)):
        return report_of(recover_training(target=target, handed_over=True, return_state=True))


def api_unreachable(exc: BaseException) -> bool:
    """Whether EXC is the Prefect API not answering, rather than a failure it answered with or a bug: a connection
    refused, reset or timed out, or a proxy before it saying so (502/503/504), anywhere in what raised it (Prefect's
    `Failed to reach API` wraps the connection's error). Such a handover is retried; any other failure is said."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, httpx.TransportError):
            return True
        if isinstance(cause, httpx.HTTPStatusError) and cause.response.status_code in (502, 503, 504):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or "(none configured)"


class Watch:
    """The watch over SOURCES (target or fleet files), re-read every round: an edit is picked up, and a file that stops
    validating is said once and watched as it last was; and over TARGETS, given as they are.

    Each death is handed over once, also across restarts of the watch: the run last handed over is kept in a Prefect
    Variable per target (tasks/memory.py), read when a target is first watched and written at each handover."""

    def __init__(self, sources: list[Path], say: Callable[[str], None], max_workers: int = 16, targets: Sequence[Target] = ()):
        self.sources, self.say = sources, say
        self.watched: dict[str, Watched] = {}
        self.bad: dict[Path, str] = {}
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="relaunch-watch")
        self.stopping = threading.Event()
        self.partitioned: set[str] = set()  # hosts of a partition already said
        for target in targets:
            self._add(target, None)

    def _add(self, target: Target, source: Path | None) -> None:
        self.watched[target.name] = Watched(target=target, source=source, handled=self._recall(target))
        self.say(f"watching {target.name} on {target.host.label}")

    def _recall(self, target: Target) -> str | None:
        try:
            return read_handed(target)
        except Exception as exc:  # noqa: BLE001 - no memory is no reason not to watch: a death may be handed over twice
            self.say(f"{target.name}: the run last handed over cannot be read ({type(exc).__name__}: {exc}); watching without it")
            return None

    def reload(self) -> None:
        for source in self.sources:
            try:
                targets = load_targets(source)
            except RelaunchError as exc:
                if self.bad.get(source) != str(exc):
                    kept = [w.target.name for w in self.watched.values() if w.source == source]
                    self.say(f"{source}: {exc}\n  the watch goes on with {', '.join(kept) or 'nothing'} of it as last read; fix the file")
                self.bad[source] = str(exc)
                continue
            if self.bad.pop(source, None) is not None:
                self.say(f"{source}: reads again")
            for target in targets:
                known = self.watched.get(target.name)
                if known is None:
                    self._add(target, source)
                else:
                    known.target = target

    def round(self, wait_seconds: float = 30.0) -> None:
        """A look at every target with no look or recovery out, all at once; the looks back within `wait_seconds` are
        judged (a death starts its recovery), the rest stay out for a later round."""
        self.reload()
        self._retry()
        for w in self.watched.values():
            if w.recovery is None and w.looking is None:
                w.looking, w.slow = self.pool.submit(look, w.target), False
        out = [w.looking for w in self.watched.values() if w.looking is not None]
        wait(out, timeout=wait_seconds)
        for w in self.watched.values():
            if w.looking is not None and w.looking.done():
                self._looked(w)
            elif w.looking is not None and not w.slow:
                w.slow = True
                self.say(f"{w.target.name}: {w.target.host.label} has not answered within {wait_seconds:.0f} s; the others are watched on")
            if w.recovery is not None and w.recovery.done():
                self._recovered(w)
        self._partition()

    def _looked(self, w: Watched) -> None:
        future, w.looking = w.looking, None
        assert future is not None
        try:
            pulse = future.result()
        except RelaunchError as exc:
            self._unreachable(w, exc)
            return
        if w.unreachable is not None:
            self.say(f"{w.target.name}: {w.target.host.label} answers again")
            w.unreachable, w.unreachable_since = None, None
            self.partitioned.discard(w.target.host.label)
        self._judge(w, pulse)

    def _unreachable(self, w: Watched, exc: RelaunchError) -> None:
        # Not a death: nothing is known of the run, so nothing is handed over. Said once per streak.
        first = str(exc).splitlines()[0]
        if w.unreachable is None:
            self.say(f"{w.target.name}: {w.target.host.label} cannot be reached ({first}); not a death: watching on")
            emit("relaunch.host.unreachable", w.target, None, reason=first[:300])
            w.unreachable_since = datetime.now(UTC)
        w.unreachable = first

    def _partition(self) -> None:
        """Hosts that stopped answering within INCIDENT_WINDOW_MINUTES of each other are one incident, as in the fleet
        (relaunch/deciding/incidents.py): said once, and one `relaunch.fleet.incident` event, not one alarm per host."""
        down = [w for w in self.watched.values() if w.unreachable_since is not None]
        sick = [
            Sick(index=i, target=w.target.name, host=w.target.host.label, verdict=None, failed_at=w.unreachable_since)
            for i, w in enumerate(down)
            if w.unreachable_since is not None
        ]
        for incident in incidents(sick, INCIDENT_WINDOW_MINUTES):
            if set(incident.hosts) <= self.partitioned:
                continue
            self.partitioned |= set(incident.hosts)
            self.say(incident.summary())
            announce_incident(incident, [w.target for w in down])

    def _judge(self, w: Watched, pulse: Pulse) -> None:
        now = seen(pulse, w.target.thresholds)
        if now is not w.last and now not in (Seen.DIED, Seen.HUNG):
            self.say(f"{w.target.name}: {now.value}" + (f" (run {pulse.run_id}, PID {pulse.pid})" if pulse.run_id else ""))
        w.last = now
        if now is Seen.HUNG:
            self._hung(w, pulse)
            return
        if not hand_over(pulse, w.handled):
            return
        # Handled from here on: a later look at the same death hands nothing over; a handover the API cannot take is
        # owed, and retried by itself (_retry).
        w.handled, w.owed = pulse.run_id, Owed(pulse)
        code = "none recorded" if pulse.exit_code is None else str(pulse.exit_code)
        self.say(
            f"{w.target.name}: the trainer of run {pulse.run_id} (PID {pulse.pid}) died, exit code {code}: recover-training starts now"
        )
        emit("relaunch.trainer.died", w.target, None, {"exit_code": pulse.exit_code}, run_id=pulse.run_id, exit_code=pulse.exit_code)
        self._hand_over(w)

    def _hung(self, w: Watched, pulse: Pulse) -> None:
        """A live run whose record stood still for the stall window's floor: handed to recovery, whose full check judges
        it again (its stacks, its own window) before anything is stopped. Not recorded as a death handed over: that
        run's later death is still handed over. Handed over again only after a backoff (the floor, doubling)."""
        if w.recovery is not None or w.owed is not None or pulse.run_id is None:
            return
        clock, floor = time.monotonic(), w.target.thresholds.stall_window_floor_seconds
        last = w.hang if w.hang is not None and w.hang.run_id == pulse.run_id else None
        if last is not None and clock < last.due:
            return
        delay = min(last.delay * 2, 8 * floor) if last is not None else floor
        w.hang = HangHanded(run_id=pulse.run_id, due=clock + delay, delay=delay)
        reading = stillness(pulse, w.target.thresholds)
        why = reading.evidence[0] if reading is not None and reading.evidence else "its progress record stands still"
        self.say(
            f"{w.target.name}: the trainer of run {pulse.run_id} (PID {pulse.pid}) lives but stands still ({why}): recover-training starts now"
        )
        emit("relaunch.trainer.hung", w.target, None, {"why": why}, run_id=pulse.run_id, motion=reading.motion.value if reading else None)
        w.owed = Owed(pulse, recorded=True)
        self._hand_over(w)

    def _hand_over(self, w: Watched) -> None:
        """The owed death's handover, in a worker thread: a Prefect API that hangs holds no look at any target."""
        assert w.owed is not None
        w.recovery = self.pool.submit(self._record_and_recover, w.target, w.owed)

    def _record_and_recover(self, target: Target, owed: Owed) -> Report:
        """The handover's record first (a restarted watch does not hand the death over again), then the recovery. An API
        that does not answer raises here, before the recovery, and _recovered defers both: a recovery started without
        the record would fail the same way."""
        if not owed.recorded:
            try:
                write_handed(target, str(owed.pulse.run_id))
            except Exception as exc:  # noqa: BLE001 - the recovery matters more than the record of it
                if api_unreachable(exc):
                    raise
                self.say(
                    f"{target.name}: could not record the handover ({type(exc).__name__}: {exc}); a restarted watch may hand it over again"
                )
            else:
                if owed.said:
                    self.say(f"{target.name}: the Prefect API answers again: the recovery of run {owed.pulse.run_id} starts now")
            owed.recorded = True
        return _recover(target)

    def _defer(self, w: Watched, exc: BaseException) -> None:
        """The owed handover tried again after its backoff; that the API does not answer is said once per death."""
        owed = w.owed
        assert owed is not None
        if not owed.said:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self.say(
                f"{w.target.name}: the Prefect API at {api_url()} does not answer ({first}): the recovery of run "
                f"{owed.pulse.run_id} is retried, after {RETRY_FIRST_SECONDS:g} s and then at waits doubling up to {RETRY_MAX_SECONDS:g} s, until it does"
            )
            owed.said = True
        owed.due = time.monotonic() + owed.delay
        owed.delay = min(owed.delay * 2, RETRY_MAX_SECONDS)

    def _retry(self) -> None:
        """Each owed handover whose backoff is over, tried again."""
        now = time.monotonic()
        for w in self.watched.values():
            if w.owed is not None and w.recovery is None and now >= w.owed.due:
                self._hand_over(w)

    def _recovered(self, w: Watched) -> None:
        future, w.recovery = w.recovery, None
        assert future is not None
        try:
            report = future.result()
        except Exception as exc:  # noqa: BLE001 - one target's failed recovery is said; the watch goes on for the others
            if w.owed is not None and api_unreachable(exc):
                # No recovery ran, or one was cut off from the API: tried again, its full check judging afresh.
                self._defer(w, exc)
                return
            w.owed = None
            self.say(f"{w.target.name}: the recovery failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            return
        w.owed = None
        self.say(f"{w.target.name}: recovery ended {report.headline()}")
        w.last = None  # the next look is said, whatever it is

    def run(self, interval_seconds: float, rounds: int | None = None) -> None:
        """Until stopped (or each target's `rounds` looks are judged): one look out per target without a recovery, held
        on its host up to `interval_seconds`, sent at most once per interval; each judged as it returns. Files are
        re-read every interval. A handover the API could not take is tried again as its backoff ends, also past the last
        round: the watch ends once none is owed."""
        reloaded = float("-inf")
        while not self.stopping.is_set():
            now = time.monotonic()
            if now - reloaded >= interval_seconds:
                self.reload()
                reloaded = now
            self._retry()
            for w in self.watched.values():
                due = w.recovery is None and w.looking is None and now >= w.looked_at + interval_seconds
                if due and (rounds is None or w.looks < rounds):
                    w.looking, w.slow, w.looked_at = self.pool.submit(look, w.target, interval_seconds), False, now
            out = [f for w in self.watched.values() for f in (w.looking, w.recovery) if f is not None]
            owed = any(w.owed is not None for w in self.watched.values())
            if rounds is not None and not out and not owed and all(w.looks >= rounds for w in self.watched.values()):
                break
            # Woken by the first look or recovery to end; at least once a second for a stop, an owed handover's backoff,
            # and every interval for the files.
            if out:
                wait(out, timeout=min(1.0, interval_seconds), return_when=FIRST_COMPLETED)
            else:
                self.stopping.wait(min(1.0, interval_seconds))
            for w in self.watched.values():
                if w.looking is not None and w.looking.done():
                    self._looked(w)
                    w.looks += 1
                    if w.last is Seen.DYING:
                        w.looked_at = float("-inf")  # its exit is being recorded: look again at once
                elif w.looking is not None and not w.slow and time.monotonic() - w.looked_at > interval_seconds + 30:
                    w.slow = True
                    self.say(
                        f"{w.target.name}: {w.target.host.label} has not answered within {interval_seconds + 30:.0f} s; the others are watched on"
                    )
                if w.recovery is not None and w.recovery.done():
                    self._recovered(w)
            self._partition()
        self.finish()

    def finish(self) -> None:
        """Recoveries already started end (a recovery cut short would leave its host half-done); then the watch ends."""
        for w in self.watched.values():
            if w.recovery is not None:
                self.say(f"{w.target.name}: waiting for its recovery to end")
                wait([w.recovery])  # what it raised is _recovered's to read
                self._recovered(w)
            if w.owed is not None:
                # Stopped while the API did not answer: what brings this death back is said, never dropped in silence.
                again = "a restarted watch hands it over" if not w.owed.recorded else "`relaunch recover` on its target file recovers it"
                self.say(
                    f"{w.target.name}: the watch ends with the recovery of run {w.owed.pulse.run_id} not done (the Prefect API did "
                    f"not answer): {again}"
                )
        # A look still out ends by its own timeouts (connect, command); nothing waits on what it would say.
        self.pool.shutdown(wait=False, cancel_futures=True)


@flow(name="watch-training", log_prints=False)
def watch_training(
    target: Target,
    interval_seconds: Annotated[float, Field(gt=0, description="Seconds between two looks at the target.")] = 10.0,
    duration_seconds: Annotated[
        float, Field(gt=0, description="How long this run watches; the watch deployment starts the next run then.")
    ] = 600.0,
) -> str:
    """Watch one target for `duration_seconds`, a look every `interval_seconds`; a death starts recover-training.

    The watch deployment (`relaunch deploy --watch`) runs this every `duration_seconds`, one run at a time: a worker
    restart costs at most one duration of watching, and nothing runs for ever on a worker slot."""
    from relaunch.tasks.common import log

    logger = log()
    watch = Watch([], logger.info, targets=[target])
    watch.run(interval_seconds, rounds=max(1, round(duration_seconds / interval_seconds)))
    w = watch.watched[target.name]
    return f"{target.name}: watched {duration_seconds:g} s" + (f"; last seen {w.last.value}" if w.last else "")
