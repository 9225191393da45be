"""The timing rule, for saves whose format is unknown: a save still being written when a stop had to SIGKILL the
trainer, or when a signal from outside killed it, is cut short wherever it was. It is the newest save whose last write
falls inside that death (a trainer writes one at a time, so at most one per death; the ones before it are complete).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from relaunch.plans.checkpoint_listing import RunFacts

# How close to a death a checkpoint's newest write must be for the death to have cut it short: a save killed
# mid-write stops writing the moment it dies; the supervisor records the death within milliseconds of it. Of the
# saves in the window only the newest is suspect: a trainer saving every 0.25 s finished the ones before it.
DEATH_WINDOW_SECONDS = 2.0
# File times come from the kernel's coarse clock, a few ms behind the stop's EPOCHREALTIME stamp: a write just
# after the SIGTERM can carry a time just before it.
CLOCK_SLACK_SECONDS = 0.1
# Deaths by a signal sent from outside, which lands wherever the trainer is, mid-write too. A trainer that
# failed by itself (an exception, SIGSEGV, SIGABRT) ran its own code up to the end: a save it had returned from
# is complete, and one it crashed inside fails to load and is refused on the next try (broken_checkpoint).
KILLED_FROM_OUTSIDE = {129: "SIGHUP", 130: "SIGINT", 137: "SIGKILL", 143: "SIGTERM"}


class Death(BaseModel):
    """A moment that ended the current run's writers, and the span of last writes it may have cut short."""

    first: float = Field(description="The earliest last write it may have cut short.")
    last: float = Field(description="The latest.")
    at: float = Field(description="The stop's SIGTERM (for a stop that had to SIGKILL), or the death.")
    stop_killed_at: float | None = Field(None, description="Set for a stop's SIGKILL: when it came.")
    exit_code: int | None = Field(None, description="Set for a death by a signal from outside: the exit code it left.")

    def covers(self, written: float) -> bool:
        return self.first <= written <= self.last

    def reason(self, written: float) -> str:
        if self.stop_killed_at is not None:
            return (
                f"written while the trainer was being killed (last written {max(0.0, written - self.at):.1f} s after the stop's "
                f"SIGTERM, which it did not survive: SIGKILLed {self.stop_killed_at - self.at:.1f} s after it; the newest save "
                "of that moment); no tracker names it complete"
            )
        signal = KILLED_FROM_OUTSIDE.get(self.exit_code or 0, "a signal")
        return (
            f"still being written when the trainer died (exit code {self.exit_code}, {signal} from outside; last written "
            f"{abs(self.at - written):.1f} s {'before' if written <= self.at else 'after'} the death, the newest save of that "
            "moment); no tracker names it complete"
        )


def deaths(run: RunFacts | None) -> list[Death]:
    """The current run's ends that may have cut a save short: a stop that had to SIGKILL, and a signal from outside
    that came before any stop. A trainer that exited by itself, or on a stop's SIGTERM within its grace, finished
    the save it was in (or crashed inside it, and the load refuses it: broken_checkpoint)."""
    if run is None:
        return []
    found = []
    if run.stop_killed_at is not None:
        term = run.stop_term_at if run.stop_term_at is not None else run.stop_killed_at - DEATH_WINDOW_SECONDS
        until = max(run.stop_killed_at, run.exit_at or 0.0) + DEATH_WINDOW_SECONDS
        found.append(Death(first=term - CLOCK_SLACK_SECONDS, last=until, at=term, stop_killed_at=run.stop_killed_at))
    # An exit code left by the stop's own signals is no death from outside; one recorded before the stop is (ranks
    # a killed torchrun left running are stopped afterwards): the listing after the stop judges it as the one before.
    stopped = run.stop_term_at if run.stop_term_at is not None else run.stop_killed_at
    death = run.exit_at
    if run.exit_code in KILLED_FROM_OUTSIDE and death is not None and (stopped is None or death < stopped - CLOCK_SLACK_SECONDS):
        found.append(Death(first=death - DEATH_WINDOW_SECONDS, last=death + DEATH_WINDOW_SECONDS, at=death, exit_code=run.exit_code))
    return found


def cut_short(saves: dict[str, float], run: RunFacts | None) -> dict[str, str]:
    """{save: why} for the saves a death of the current run may have cut short, from {save: its last write}.

    A trainer writes one checkpoint at a time, so a death cuts short at most one: the newest save whose last write
    falls in its window. The ones before it were finished before it began (a trainer saving every 0.25 s has
    several in the window). Writes before the run's start are an earlier run's; long after the death, another
    program's.
    """
    found: dict[str, str] = {}
    for death in deaths(run):
        started = run.started_at if run is not None else None
        inside = [(w, name) for name, w in saves.items() if death.covers(w) and (started is None or w >= started)]
        if inside:
            written, name = max(inside)
            found.setdefault(name, death.reason(written))
    return found
