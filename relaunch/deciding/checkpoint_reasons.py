"""Why a checkpoint is not taken, as data: a Reason the rules act on, and the prose a person reads. Nothing compares
the prose: rewording a message changes no choice."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel


class Reason(str, Enum):
    # By its name (relaunch/deciding/checkpoint_names.py)
    HIDDEN = "hidden"
    UNFINISHED = "unfinished"  # `*.tmp`, `tmp-*`, `*.partial`: written under a name it is renamed from when complete
    EMPTY = "empty"
    NOT_A_FILE = "not_a_file"
    NUMBER_NOT_A_STEP = "number_not_a_step"  # a date, a version, a decimal, a rank's or a shard's number
    NOT_A_NAME = "not_a_name"  # no checkpoint name ending in its step number
    # By a framework tracker (checkpoint_trackers.py)
    NOT_TRACKED_SERIES = "not_tracked_series"
    ABOVE_TRACKED = "above_tracked"
    # By what happened to it
    REFUSED = "refused"  # failed to load in an earlier attempt
    CUT = "cut"  # its format proves it cut short or damaged (checkpoint_formats.py)
    CUT_BY_TIME = "cut_by_time"  # unknown format, the newest save a death's window holds (checkpoint_deaths.py)
    AT_OR_AFTER_DIVERGENCE = "at_or_after_divergence"  # written at or after the step a divergence began
    NO_STEP_BEFORE_DIVERGENCE = "no_step_before_divergence"  # Lightning's last.ckpt names no step
    PARTS_NEED_FOLDER = "parts_need_folder"  # saved as one file per part: `{checkpoint}` names one path
    # Against the other candidates
    OLDER_LAST = "older_last"  # an older Lightning last.ckpt than another
    STALE_LAST = "stale_last"  # Lightning's last.ckpt, older than a save beside it
    OLDER_THAN_LAST = "older_than_last"  # older than Lightning's last.ckpt, the newest by definition
    OTHER_SERIES = "other_series"  # of another series than the run's newest save's
    # The run's own trajectory (checkpoint_trajectory.py)
    ABANDONED_BRANCH = "abandoned_branch"  # written before the run began, above the checkpoint it resumed from
    EARLIER_TRAJECTORY = "earlier_trajectory"  # above the save taken in step order, or newer, but not of the run's own saves
    COUNTER_RESET = "counter_reset"  # above the save taken in step order, written earlier by the same run


# Reasons that cannot hide a real checkpoint: with only these in the folder, starting from scratch loses nothing.
HARMLESS = frozenset({Reason.HIDDEN, Reason.UNFINISHED, Reason.EMPTY})


class Skip(BaseModel):
    """Why one candidate is not taken."""

    reason: Reason
    says: str


class Skipped(Skip):
    """A skip with the name it is of (a checkpoint in parts: its files joined with ` + `)."""

    name: str

    def line(self) -> str:
        return f"{self.name!r}: {self.says}"
