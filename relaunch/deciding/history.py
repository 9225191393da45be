"""What the last nights did, and the restart storm they may add up to. Pure: tasks/memory.py reads and writes it.

Every recover-training run adds one Night: what its first check found (verdict, cause), the checkpoint the failed
attempt had been launched from, and how the recovery ended. A failure whose cause returns `storm_max_returns`
times within `storm_window_hours` with that checkpoint never advancing is a restart storm: relaunching it once more
would only burn another night (NVIDIA's resiliency extension stops after 3 restart cycles without checkpoint
progress). Infrastructure causes (Cause.is_infrastructure) neither count nor end a streak.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from relaunch.deciding.checkpoints import step_of
from relaunch.deciding.ledger import Placement
from relaunch.deciding.playbook import steps_for
from relaunch.judging.findings import Diagnosis
from relaunch.vocabulary import Action, Cause, Step, Verdict

# A Prefect Variable holds at most 5,000 characters of JSON (prefect.types.MAX_VARIABLE_VALUE_LENGTH); the oldest
# nights are dropped first to stay under it, with room for the wrapper.
MAX_HISTORY_CHARS = 4600
MAX_NIGHTS = 20


class Night(BaseModel):
    """One recovery of one target, as the next nights need to know it."""

    at: datetime = Field(description="When the recovery's first check judged the run (UTC).")
    verdict: Verdict = Field(description="What the first check found.")
    cause: Cause | None = Field(None, description="The cause it found, if any.")
    checkpoint: str | None = Field(None, description="Name of the checkpoint the failed attempt had been launched from (None: none).")
    checkpoint_step: int | None = Field(None, description="The step that checkpoint's name carries, where it carries one.")
    last_step: int | None = Field(None, description="The highest step line the failed attempt's log reached.")
    action: Action | None = Field(None, description="What the recovery did first.")
    ended: Verdict | None = Field(None, description="The recovery's final verdict (None: a step failed).")
    flow_run: str = Field("", description="The recover-training flow run's id.")

    @property
    def label(self) -> str:
        return f"{self.verdict.value}/{self.cause.value}" if self.cause else self.verdict.value

    def line(self) -> str:
        where = f"checkpoint {self.checkpoint}" if self.checkpoint else "no checkpoint"
        step = f", log reached step {self.last_step}" if self.last_step is not None else ""
        done = f" -> {self.action.value}" if self.action else ""
        ended = f", ended {self.ended.value}" if self.ended else ""
        return f"{self.at:%Y-%m-%d %H:%M} UTC: {self.label} from {where}{step}{done}{ended}"


class History(BaseModel):
    """A target's nights, oldest first (what the Prefect Variable holds)."""

    target: str
    nights: list[Night] = Field(default_factory=list)

    def with_night(self, night: Night) -> History:
        """This history with the night added (or replacing one of the same flow run), trimmed to fit a Variable."""
        kept = [n for n in self.nights if not (night.flow_run and n.flow_run == night.flow_run)]
        out = History(target=self.target, nights=[*kept, night][-MAX_NIGHTS:])
        while len(out.nights) > 1 and len(json.dumps(out.model_dump(mode="json"))) > MAX_HISTORY_CHARS:
            out.nights = out.nights[1:]
        return out


class Storm(BaseModel):
    """A cause that kept returning with no checkpoint progress: the nights that add up to it, oldest first."""

    nights: list[Night]
    window_hours: float

    def why(self) -> str:
        last = self.nights[-1]
        where = f"checkpoint {last.checkpoint}" if last.checkpoint else "no checkpoint"
        history = "; ".join(n.line() for n in self.nights)
        return (
            f"restart storm: {last.label} returned {len(self.nights)} times within {self.window_hours:g} h, each time from {where} "
            f"(the checkpoint never advanced): not relaunched again; a person must look. Nights: {history}"
        )


def night_of(diagnosis: Diagnosis, checkpoint: str | None, at: datetime, flow_run: str = "") -> Night:
    """The night a recovery starts from: its first check's diagnosis, and the checkpoint the failed attempt ran from."""
    name = checkpoint.rstrip("/").rsplit("/", 1)[-1] if checkpoint else None
    return Night(
        at=at,
        verdict=diagnosis.verdict,
        cause=diagnosis.cause,
        checkpoint=name,
        checkpoint_step=step_of(name) if name else None,
        last_step=diagnosis.metrics.last_step,
        flow_run=flow_run,
    )


def uses_restart_budget(night: Night) -> bool:
    """A failure of the training code that relaunch would relaunch: sick, launched before, not the machine's fault."""
    if not night.verdict.needs_recovery() or night.verdict is Verdict.UNKNOWN:
        return False  # fine, or never launched: nothing returned
    return night.cause is None or not night.cause.is_infrastructure()


def advanced(before: Night, after: Night) -> bool:
    """The later night's failed attempt ran from a newer checkpoint than the earlier one's: training got somewhere."""
    if before.checkpoint_step is not None and after.checkpoint_step is not None:
        return after.checkpoint_step > before.checkpoint_step
    return after.checkpoint is not None and after.checkpoint != before.checkpoint


def restart_storm(earlier: list[Night], now: Night, window_hours: float, max_returns: int) -> Storm | None:
    """The storm `now` completes, or None. Walks back from now: nights outside the window end the walk, a night the
    checkpoint advanced from ends it too, infrastructure nights are passed over, same-failure nights count."""
    if not uses_restart_budget(now):
        return None
    since = now.at - timedelta(hours=window_hours)
    streak = [now]
    for night in reversed(earlier):
        if night.at < since:
            break
        if not uses_restart_budget(night):
            continue
        if advanced(night, now):
            break
        if (night.verdict, night.cause) == (now.verdict, now.cause):
            streak.append(night)
    return Storm(nights=streak[::-1], window_hours=window_hours) if len(streak) >= max_returns else None


def across_nights(action: Action, why: str, diagnosis: Diagnosis, storm: Storm | None, placement: Placement) -> tuple[Action, str]:
    """The playbook's action, corrected by what the last nights did: a storm or a ledgered GPU with nowhere else to run
    escalates any relaunch; a GPU fault with spares to run on relaunches there instead of escalating."""
    launches = Step.LAUNCH in steps_for(action)
    if storm is not None and launches:
        return Action.ESCALATE, storm.why()
    if action is Action.ESCALATE and diagnosis.cause is Cause.GPU_FAULT and placement.banned and not placement.blocked:
        return Action.RELAUNCH, f"a GPU failed; {placement.why}: relaunch from the newest checkpoint"
    if launches and placement.blocked:
        return Action.ESCALATE, placement.why
    if launches and placement.banned:
        return action, f"{why}; {placement.why}"
    return action, why
