"""The candidates a choice is made among (an entry, or a checkpoint saved as one file per part), and the rules that
rule one out: small named functions, each returning a Skip (a Reason and its prose) or None, asked in order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from relaunch.deciding.checkpoint_formats import Content
from relaunch.deciding.checkpoint_names import (
    LIGHTNING_LAST,
    counters,
    listed,
    name_problem,
    order_of,
    part_groups,
    series_key,
    series_of,
    step_of,
)
from relaunch.deciding.checkpoint_reasons import HARMLESS, Reason, Skip, Skipped
from relaunch.deciding.checkpoint_trackers import Tracker
from relaunch.deciding.checkpoint_trajectory import Evidence, abandoned
from relaunch.plans.checkpoint_listing import Entry


@dataclass
class Candidate:
    """One checkpoint the trainer could resume from: an entry, or the files of one saved as a file per part."""

    name: str  # how the reasons name it: the entry's name, or the parts' names joined with ` + `
    entries: list[Entry]
    step: int | None
    series: str
    parts: list[str] = field(default_factory=list)
    contents: list[Content | None] = field(default_factory=list)
    order: tuple[int, ...] = ()  # where it stands in its run's order by its name (checkpoint_names.standing)

    @property
    def entry(self) -> Entry | None:
        return None if self.parts else self.entries[0]

    @property
    def pick(self) -> str:
        """The name a launch passes: the entry's, or a checkpoint in parts' first file."""
        return self.parts[0] if self.parts else self.name

    @property
    def written(self) -> float:
        return max(e.written for e in self.entries)

    @property
    def mtime(self) -> float:
        return max(e.mtime for e in self.entries)

    @property
    def content(self) -> Content | None:
        return None if self.parts else self.contents[0]


@dataclass
class Facts:
    """What the rules read besides the candidate."""

    refused: set[tuple[int, str]]
    before_step: int | None
    resume_from: Literal["entry", "folder"]
    tracker: Tracker | None
    tracked: Entry | None
    suspects: dict[str, str] = field(default_factory=dict)
    trajectory: Evidence | None = None  # None where a tracker's word decides


def candidates(entries: list[Entry], content: dict[str, Content], ignore: set[str]) -> list[Candidate]:
    """Every entry but the trackers (`ignore`), then each checkpoint in parts; a part's own file is no candidate."""
    groups = part_groups(entries)
    in_group = {m.name for members in groups.values() for m in members}
    found = []
    for e in sorted(entries, key=lambda e: e.name):
        problem = name_problem(e)
        if e.name in ignore or (e.name in in_group and problem is not None and problem.reason is Reason.NOT_A_NAME):
            continue
        single = Candidate(name=e.name, entries=[e], step=step_of(e.name), series=series_of(e.name) or "", contents=[content.get(e.name)])
        single.order = order_of(e.name) or ()
        found.append(single)
    for (series, step), members in sorted(groups.items()):
        parts = [m.name for m in sorted(members, key=lambda m: m.name)]
        contents = [content.get(n) for n in parts]
        order = (*counters(series), step)
        found.append(
            Candidate(name=listed(members), entries=members, step=step, series=series, parts=parts, contents=contents, order=order)
        )
    return found


def by_name(c: Candidate, f: Facts) -> Skip | None:
    """Hidden, unfinished, empty, not a file, a number that is no step, no checkpoint name; a part of a group so."""
    if c.entry is None:
        return next((p for m in c.entries if (p := name_problem(m)) is not None and p.reason in HARMLESS), None)
    if c.entry is f.tracked and c.name == "release":
        return None  # Megatron's converted checkpoint: its tracker names it
    return name_problem(c.entry)


def by_tracker(c: Candidate, f: Facts) -> Skip | None:
    """A tracker names its checkpoint, and the ones of its series before it, complete: it is written after the save."""
    if f.tracker is None or f.tracked is None or c.entry is f.tracked:
        return None
    other = Skip(reason=Reason.NOT_TRACKED_SERIES, says=f"not of the series {f.tracker.label} tracks")
    tracked_step = step_of(f.tracked.name)
    if c.entry is None or series_of(c.name) != series_of(f.tracked.name) or tracked_step is None:
        return other
    if c.step is not None and c.step > tracked_step:
        return Skip(reason=Reason.ABOVE_TRACKED, says=f"newer than what {f.tracker.label} names complete: a save that never finished")
    return None


def by_refusal(c: Candidate, f: Facts) -> Skip | None:
    """Failed to load once (mtime and name recorded): never taken again; a newer file under the same name is."""
    refused = [m.name for m in c.entries if (int(m.mtime), m.name) in f.refused]
    if not refused:
        return None
    if c.entry is not None:
        return Skip(reason=Reason.REFUSED, says="failed to load in an earlier attempt (recorded in the state folder; kept, never deleted)")
    return Skip(reason=Reason.REFUSED, says=f"{refused[0]}: failed to load in an earlier attempt")


def by_content(c: Candidate, f: Facts) -> Skip | None:
    """A save its format proves cut (or damaged) is never taken, whatever a tracker or the clock says."""
    cut = [(m.name, k) for m, k in zip(c.entries, c.contents, strict=True) if k is not None and k.state == "cut"]
    if not cut:
        return None
    name, content = cut[0]
    if c.entry is None:
        return Skip(reason=Reason.CUT, says=f"{name}: {content.says()}")
    whatever = f" (whatever {f.tracker.label} says)" if f.tracker is not None and c.entry is f.tracked else ""
    return Skip(reason=Reason.CUT, says=content.says() + whatever)


def by_time(c: Candidate, f: Facts) -> Skip | None:
    """Of unknown format, the newest save a death's window holds (see checkpoint_deaths.py)."""
    says = f.suspects.get(c.name)
    return Skip(reason=Reason.CUT_BY_TIME, says=says) if says else None


def by_divergence(c: Candidate, f: Facts) -> Skip | None:
    """Written at or after the step a divergence began; Lightning's last.ckpt names no step, so it is not known before."""
    if f.before_step is None:
        return None
    if c.step is not None and c.step >= f.before_step:
        return Skip(reason=Reason.AT_OR_AFTER_DIVERGENCE, says=f"written at or after step {f.before_step}")
    if c.step is None and c.entry is not None and LIGHTNING_LAST.match(c.name):
        return Skip(
            reason=Reason.NO_STEP_BEFORE_DIVERGENCE, says=f"Lightning's {c.name} names no step: not known to be before step {f.before_step}"
        )
    return None


def by_trajectory(c: Candidate, f: Facts) -> Skip | None:
    """Written before the current run began, above the checkpoint it resumed from: a branch it left (a rollback)."""
    if f.trajectory is None or not c.order:
        return None
    return abandoned(c.written, c.order, c.series, f.trajectory)


def by_resume_arg(c: Candidate, f: Facts) -> Skip | None:
    """A checkpoint in parts needs the trainer to get the folder: `{checkpoint}` names one path."""
    if c.entry is not None or f.resume_from != "entry":
        return None
    return Skip(
        reason=Reason.PARTS_NEED_FOLDER,
        says=f"step {c.step}'s checkpoint saved as {len(c.parts)} files: `{{checkpoint}}` names one path, so relaunch cannot pass it "
        "(resume_from: folder gives the trainer checkpoint_dir)",
    )


Rule = Callable[[Candidate, Facts], Skip | None]
RULES: tuple[Rule, ...] = (by_name, by_tracker, by_refusal, by_content, by_time, by_divergence, by_trajectory, by_resume_arg)


def first_skip(c: Candidate, f: Facts) -> Skip | None:
    return next((s for rule in RULES if (s := rule(c, f)) is not None), None)


def own_series(usable: list[Candidate], skipped: list[Skipped]) -> list[Candidate]:
    """The candidates of the run's own series, the one its newest save is of: step numbers compare only within a
    series (`resnet50.pt`, a base model kept in checkpoint_dir, is not step 50 of the run writing `step_20.pt`). The
    others are said in `skipped`."""
    keys = {c.name: series_key(c.series) for c in usable}
    if len(set(keys.values())) < 2:
        return usable
    newest = max(usable, key=lambda c: (c.written, c.step or 0, c.pick))
    own = keys[newest.name]
    for c in usable:
        if keys[c.name] != own:
            says = f"of another series than the newest save's ({newest.series or 'a bare number'}): its number is no step of the run's"
            skipped.append(Skipped(name=c.name, reason=Reason.OTHER_SERIES, says=says))
    return [c for c in usable if keys[c.name] == own]
