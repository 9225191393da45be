"""`relaunch watch`: a death is handed to recover-training the round it is seen, instead of at the next nightly check.

One loop over every watched target (a host is reached through its one shared connection, relaunch.wire.transport), every
`interval_seconds`: a cheap look each (relaunch/host/pulse.sh, relaunch/judging/watching.py), all hosts of a round at once.
`run` keeps one look out per target, held on its host while the trainer lives (pulse.sh returns the moment the
trainer's exit is recorded), and judges each look as it comes back: a death is handed over within a nap of it,
whatever the interval. A host slow to answer (one that hangs until its connect timeout) holds only its own look.
The watch itself stops nothing and judges nothing: a death it sees starts the recover-training flow, whose full check,
locks and never-harm rules decide what happens, exactly as for `relaunch recover`. What it sees is also a Prefect
event (`relaunch.trainer.died`, `relaunch.host.unreachable`), for the UI and for automations.
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

from prefect import flow
from pydantic import Field

from relaunch.config import Target, load_targets
from relaunch.deciding.incidents import Sick, incidents
from relaunch.errors import RelaunchError
from relaunch.flows.fleet import announce_incident
from relaunch.flows.outcome import emit, report_of, run_tags
from relaunch.flows.recover import recover_training
from relaunch.judging.watching import Pulse, Seen, hand_over, seen
from relaunch.plans.watch import parse_pulse, plan_pulse
from relaunch.records.report import Report
from relaunch.tasks.memory import read_handed, write_handed
from relaunch.wire.transport import run, transport_for

# As the fleet's default: hosts that stopped answering within this many minutes of each other are one incident.
INCIDENT_WINDOW_MINUTES = 10.0


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


def look(target: Target, hold_seconds: float = 0.0) -> Pulse:
    return parse_pulse(run(transport_for(target.host), plan_pulse(target, hold_seconds)).stdout)


def _recover(target: Target) -> Report:
    """The recovery as `relaunch recover` runs it: tagged with its target and host, its report whether it Completed or
    ended Failed (an escalation)."""
    from prefect import tags

    with tags(*run_tags(target)):
        return report_of(recover_training(target=target, return_state=True))


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
        now = seen(pulse)
        if now is not w.last and now is not Seen.DIED:
            self.say(f"{w.target.name}: {now.value}" + (f" (run {pulse.run_id}, PID {pulse.pid})" if pulse.run_id else ""))
        w.last = now
        if not hand_over(pulse, w.handled):
            return
        w.handled = pulse.run_id
        try:
            write_handed(w.target, str(pulse.run_id))
        except Exception as exc:  # noqa: BLE001 - the recovery matters more than the record of it
            self.say(
                f"{w.target.name}: could not record the handover ({type(exc).__name__}: {exc}); a restarted watch may hand it over again"
            )
        code = "none recorded" if pulse.exit_code is None else str(pulse.exit_code)
        self.say(
            f"{w.target.name}: the trainer of run {pulse.run_id} (PID {pulse.pid}) died, exit code {code}: recover-training starts now"
        )
        emit("relaunch.trainer.died", w.target, None, {"exit_code": pulse.exit_code}, run_id=pulse.run_id, exit_code=pulse.exit_code)
        w.recovery = self.pool.submit(_recover, w.target)

    def _recovered(self, w: Watched) -> None:
        future, w.recovery = w.recovery, None
        assert future is not None
        try:
            report = future.result()
        except Exception as exc:  # noqa: BLE001 - one target's failed recovery is said; the watch goes on for the others
            self.say(f"{w.target.name}: the recovery failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            return
        self.say(f"{w.target.name}: recovery ended {report.headline()}")
        w.last = None  # the next look is said, whatever it is

    def run(self, interval_seconds: float, rounds: int | None = None) -> None:
        """Until stopped (or each target's `rounds` looks are judged): one look out per target without a recovery, held
        on its host up to `interval_seconds`, sent at most once per interval; each judged as it returns. Files are
        re-read every interval."""
        reloaded = float("-inf")
        while not self.stopping.is_set():
            now = time.monotonic()
            if now - reloaded >= interval_seconds:
                self.reload()
                reloaded = now
            for w in self.watched.values():
                due = w.recovery is None and w.looking is None and now >= w.looked_at + interval_seconds
                if due and (rounds is None or w.looks < rounds):
                    w.looking, w.slow, w.looked_at = self.pool.submit(look, w.target, interval_seconds), False, now
            out = [f for w in self.watched.values() for f in (w.looking, w.recovery) if f is not None]
            if rounds is not None and not out and all(w.looks >= rounds for w in self.watched.values()):
                break
            # Woken by the first look or recovery to end; at least once a second for a stop, every interval for the files.
            wait(out, timeout=min(1.0, interval_seconds), return_when=FIRST_COMPLETED)
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
                w.recovery.result()
                self._recovered(w)
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
