"""The run's own trajectory: which saves continue the run that died. The highest number is not always the newest
save: a person rolled back after a loss spike (`step_460.pt` of the new trajectory, `step_800.pt` of the branch it
left), a second stage counts from 0 again in the same names. The evidence, as an expert reads it:
- the saves written since the current run began are its own; within one run, write order is its order;
- the checkpoint it resumed from (RUN/checkpoint, recorded at launch; an adopted run's command line may name it):
  a save written before the run began and above that checkpoint is of a branch the run left;
- with neither, write order and step order must agree; where they disagree, a person is asked (no guess).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relaunch.deciding.checkpoint_deaths import CLOCK_SLACK_SECONDS
from relaunch.deciding.checkpoint_names import series_key, standing
from relaunch.deciding.checkpoint_reasons import Reason, Skip, Skipped
from relaunch.plans.checkpoint_listing import RunFacts

if TYPE_CHECKING:
    from relaunch.deciding.checkpoint_rules import Candidate


@dataclass(frozen=True)
class Evidence:
    """When the current run began, and what it resumed from: a name, `` for from scratch, None where unknown."""

    started: float | None = None
    resumed: str | None = None
    how: str = ""

    @property
    def resumed_standing(self) -> tuple[str, tuple[int, ...]] | None:
        """The series key and order of the checkpoint it resumed from, where its name carries a step."""
        found = standing(self.resumed) if self.resumed else None
        return (series_key(found[0]), found[1]) if found else None


def evidence(run: RunFacts | None, names: list[str]) -> Evidence:
    """What the current run's records say of its trajectory; `names`, the checkpoint names the folder holds, are what
    an adopted run's command line may name (exactly one of them, as a whole path component)."""
    if run is None:
        return Evidence()
    if run.resumed_from is not None:
        return Evidence(started=run.started_at, resumed=run.resumed_from, how="recorded at its launch")
    if run.command:
        named = [n for n in names if re.search(rf"(?:^|[\s/='\"]){re.escape(n)}(?:$|[\s/'\"])", run.command)]
        if len(named) == 1:
            return Evidence(started=run.started_at, resumed=named[0], how="named by its command line")
    return Evidence(started=run.started_at)


def abandoned(written: float, order: tuple[int, ...] | None, series: str, ev: Evidence) -> Skip | None:
    """A save written before the current run began, above the checkpoint it resumed from (or any, where it began from
    scratch), is not of its trajectory: a branch it left."""
    if ev.started is None or ev.resumed is None or written >= ev.started:
        return None
    if ev.resumed == "":
        return Skip(reason=Reason.ABANDONED_BRANCH, says="written before the current run began from scratch: not of its trajectory")
    start = ev.resumed_standing
    if start is None or order is None or series_key(series) != start[0] or order <= start[1]:
        return None
    return Skip(
        reason=Reason.ABANDONED_BRANCH,
        says=f"of a branch the current run left: written before it began, above {ev.resumed}, the checkpoint it resumed from ({ev.how})",
    )


@dataclass
class Followed:
    """The save that continues the run (or None, with why a person must say which), and why."""

    pick: Candidate | None
    why: str = ""  # where it is not the highest in step order: why it is taken
    note: str = ""  # said after
    escalate: str | None = None


def _ago(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.1f} s"


def follow(usable: list[Candidate], ev: Evidence, skipped: list[Skipped]) -> Followed:
    """Of the usable saves of one series, the one that continues the run: its newest own save, else the checkpoint it
    resumed from, else the highest in step order where write order agrees; else an escalation. Every save above the
    one taken in step order, or written after it, is said in `skipped` with why."""
    top = max(usable, key=lambda c: (c.order, c.mtime, c.pick))
    own = [c for c in usable if ev.started is not None and c.written >= ev.started]
    start = next((c for c in usable if ev.resumed and ev.resumed in (c.name, c.pick)), None)
    if own:
        pick = max(own, key=lambda c: (c.written, c.order, c.pick))
        why, basis = "the current run's newest save", f"the current run saved {pick.name} since it began"
    elif start is not None:
        pick, why = start, f"the checkpoint the current run resumed from ({ev.how}); it saved nothing usable since"
        basis = f"the current run resumed from {pick.name}"
    else:
        return _by_order(usable, top, ev)
    for c in usable:
        if c is not pick and (c.order > pick.order or c.written > pick.written + CLOCK_SLACK_SECONDS):
            skipped.append(_passed_over(c, pick, c in own, basis))
    if top is pick or top.order <= pick.order:
        return Followed(pick=pick, note=why)
    note = f"step order and write order disagree: {top.name} is higher in step order, {pick.name} continues the run"
    return Followed(pick=pick, why=why, note=note)


def _by_order(usable: list[Candidate], top: Candidate, ev: Evidence) -> Followed:
    """With no save of the current run and no checkpoint it resumed from to go by: the highest in step order, where
    it is the newest written too; else a person is asked."""
    newest = max(usable, key=lambda c: (c.written, c.order, c.pick))
    if newest is top or newest.written <= top.written + CLOCK_SLACK_SECONDS:
        return Followed(pick=top)
    lacking = "no record of when the current run began" if ev.started is None else "the current run has saved nothing since it began"
    if not ev.resumed:
        lacking += ", and no record says which checkpoint it resumed from"
    else:
        lacking += f", and {ev.resumed}, which it resumed from, is not usable"
    problem = (
        f"step order and write order disagree: {top.name} is highest in step order, {newest.name} was written "
        f"{_ago(newest.written - top.written)} after it; relaunch cannot tell which trajectory the run is on ({lacking})"
    )
    return Followed(pick=None, escalate=problem)


def _passed_over(c: Candidate, pick: Candidate, own: bool, basis: str) -> Skipped:
    """Why a save above the one taken in step order, or written after it, is not taken."""
    if own:
        says = (
            f"above {pick.name} in step order, but written {_ago(pick.written - c.written)} before it by the current run: its "
            "counter started again, and within one run the later save is the newer"
        )
        return Skipped(name=c.name, reason=Reason.COUNTER_RESET, says=says)
    where = f"above {pick.name} in step order" if c.order > pick.order else f"written after {pick.name}"
    says = f"{where}, but before the current run began, and {basis}: of another trajectory than the run's own"
    return Skipped(name=c.name, reason=Reason.EARLIER_TRAJECTORY, says=says)
