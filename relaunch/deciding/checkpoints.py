"""Which checkpoint a relaunch resumes from: a pure choice over the folder's listing, with its reasons.

The host only lists (relaunch/host/list_checkpoints.sh, read by relaunch/plans/checkpoint_listing.py); the choice is
made here, by jobs each in its module:
- checkpoint_names.py: which names are saves, the step a name carries (base 10), its series, checkpoints in parts;
- checkpoint_formats.py, checkpoint_folders.py: a save judged by its content where its format is known (torch.save
  zip, safetensors, .npy, pickle, JSON; DCP, Hugging Face Trainer, a folder of such files beside the series' previous
  save): a complete one is taken however close to a death it was written, a cut one never;
- checkpoint_deaths.py: only where the format is unknown, the timing rule: the newest save a death's window holds;
- checkpoint_trackers.py: a framework tracker names the newest *complete* save (Megatron, DeepSpeed, a `latest` link);
- checkpoint_rules.py: the candidates and the rules that rule one out, each a function returning a Skip (a Reason
  and its prose) or None; reasons are compared as Reasons, never as text;
- checkpoint_trajectory.py: the run's own order, not the highest number: its own saves since it began, the
  checkpoint it resumed from, and a person asked where write order and step order disagree with nothing to settle it.
A folder that holds names but nothing usable is a question for a person (`Choice.escalate`), never a silent
run from scratch whose new `step_60.pt` would then become "newest" over the work it could not read.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from relaunch.deciding.checkpoint_deaths import CLOCK_SLACK_SECONDS, cut_short
from relaunch.deciding.checkpoint_folders import judge_all
from relaunch.deciding.checkpoint_formats import Content, judge_file
from relaunch.deciding.checkpoint_names import LIGHTNING_LAST, is_save, not_a_step, series_of, skip_reason, step_of
from relaunch.deciding.checkpoint_reasons import HARMLESS, Reason, Skipped
from relaunch.deciding.checkpoint_rules import Candidate, Facts, by_name, candidates, first_skip, own_series
from relaunch.deciding.checkpoint_trackers import TRACKER_FILES, Tracker, trackers
from relaunch.deciding.checkpoint_trajectory import Followed, evidence, follow
from relaunch.plans.checkpoint_listing import Entry, EntryProbe, Probe, RunFacts

__all__ = [
    "Choice",
    "Entry",
    "EntryProbe",
    "Probe",
    "RunFacts",
    "choose",
    "judge_file",
    "not_a_step",
    "series_of",
    "skip_reason",
    "step_of",
]


class Choice(BaseModel):
    """The checkpoint chosen, and what a person reads about why."""

    name: str | None = Field(None, description="Chosen entry, or None: start from scratch.")
    step: int | None = None
    why: str = ""
    skipped: list[str] = Field(default_factory=list, description="Names not taken, each with its reason.")
    skips: list[Skipped] = Field(default_factory=list, description="The same, as data: each name with its Reason.")
    parts: list[str] = Field(default_factory=list, description="The files of a checkpoint saved as one file per part.")
    tracker: str | None = Field(None, description="The framework tracker that named the choice, and what it says.")
    escalate: str | None = Field(None, description="Why no choice may be made without a person: set, nothing is launched.")
    content: str | None = Field(None, description="What its content says: complete by its format, or judged by time.")
    blocked_by: Literal["nothing_usable", "tracker", "loader", "trajectory"] | None = Field(
        None,
        description="What escalates: names but nothing usable, a tracker's word, what a folder loader would take, or saves "
        "whose write order and step order disagree with nothing to say which trajectory the run is on.",
    )


def choose(
    entries: list[Entry],
    refused: set[tuple[int, str]] | None = None,
    before_step: int | None = None,
    *,
    links: dict[str, str] | None = None,
    contents: dict[str, str] | None = None,
    run: RunFacts | None = None,
    resume_from: Literal["entry", "folder"] = "entry",
    probes: dict[str, EntryProbe] | None = None,
) -> Choice:
    """The newest save of the run's own trajectory: the highest in its order (an epoch's or a stage's number first,
    then the step) where write order agrees; its own newest save, or the checkpoint it resumed from, where they
    disagree (`run`), else an escalation. Equal steps go to the newest. `refused` (mtime in whole seconds, name)
    entries failed to load once and are never taken again; a newer file under the same name is.

    A tracker's word beats the highest step; a save the current run's end may have cut short is skipped; with
    `resume_from="folder"` the trainer's loader picks for itself, so a choice it would not make escalates.

    `probes`, the bytes the host read of the newest entries, come first: an entry whose format proves it cut is never
    taken (whatever a tracker or the clock says), one whose format proves it whole is never skipped for timing; only
    an entry of unknown format, or not read, is judged by the timing rule, and its reason says so. Lightning's
    `last.ckpt`, whole, is the newest save by definition.
    """
    names = {e.name: e for e in entries}
    found = trackers(names, links or {}, contents or {})
    if stop := _tracker_problem(found):
        return stop
    tracker = found[0] if found else None
    tracked = names[tracker.names] if tracker and tracker.names else None
    content = judge_all(entries, probes or {})
    ignore = set(TRACKER_FILES & (set(contents or {}) | set(links or {})))
    every = candidates(entries, content, ignore)
    facts = Facts(refused=refused or set(), before_step=before_step, resume_from=resume_from, tracker=tracker, tracked=tracked)
    if tracked is None:
        facts.suspects = _suspects(every, run)
        facts.trajectory = evidence(run, [c.pick for c in every if c.order])
    usable: list[Candidate] = []
    skipped: list[Skipped] = []
    for c in every:
        if (skip := first_skip(c, facts)) is not None:
            skipped.append(Skipped(name=c.name, reason=skip.reason, says=skip.says))
        else:
            usable.append(c)
    loader_takes = _loader_pick(every, facts) if tracker is None else tracked.name if tracked else None
    lasts = [c for c in usable if c.entry is not None and LIGHTNING_LAST.match(c.name)]
    usable = [c for c in usable if c not in lasts]
    if lasts and (last := _lightning_last(lasts, usable, skipped)) is not None:
        choice = _chosen(last, usable, skipped, None, tracked, lightning=True)
    else:
        usable = own_series(usable, skipped)
        if not usable:
            return _nothing(entries, ignore, skipped)
        followed = follow(usable, facts.trajectory, skipped) if facts.trajectory is not None else None
        if followed is not None and followed.escalate:
            lines = [s.line() for s in skipped]
            return Choice(why=followed.escalate, skipped=lines, skips=skipped, escalate=followed.escalate, blocked_by="trajectory")
        top = followed.pick if followed and followed.pick else max(usable, key=lambda c: (c.order, c.mtime, c.pick))
        choice = _chosen(top, usable, skipped, tracker, tracked, trajectory=followed)
    if resume_from == "folder":
        return _as_folder(choice, loader_takes, tracker, skipped)
    return choice


def _tracker_problem(found: list[Tracker]) -> Choice | None:
    """A tracker naming what is not there, or trackers that disagree: relaunch does not guess."""
    if broken := [t for t in found if t.problem]:
        problem = "; ".join(f"its tracker {t.label} {t.problem}" for t in broken)
        return Choice(
            why=problem, escalate=f"{problem}: relaunch does not guess which checkpoint the framework would load", blocked_by="tracker"
        )
    if len({t.names for t in found}) > 1:
        problem = "its trackers disagree: " + ", ".join(f"{t.label} names {t.names}" for t in found)
        return Choice(why=problem, escalate=problem, blocked_by="tracker")
    return None


def _suspects(every: list[Candidate], run: RunFacts | None) -> dict[str, str]:
    """{candidate: why} for the save a death of the current run may have cut short; the clock only judges what the
    content cannot, so a save whose format is known is judged by it."""
    saves = {c.name: c.written for c in every if c.entry is None or is_save(c.name)}
    single = {c.name: c.content for c in every if c.entry is not None}
    return {name: f"{why}; {_content_why(single.get(name))}" for name, why in cut_short(saves, run).items() if _unknown(single.get(name))}


def _loader_pick(every: list[Candidate], facts: Facts) -> str | None:
    """What a loader reading the folder itself, with no tracker, would take: taken to be the highest step there (in
    the order of its numbers: an epoch's before its step)."""
    named = [(c.order, c.pick) for c in every if by_name(c, facts) is None]
    return max(named)[1] if named else None


def _lightning_last(lasts: list[Candidate], usable: list[Candidate], skipped: list[Skipped]) -> Candidate | None:
    """Lightning's newest last.ckpt, whole, is the newest save by definition, unless a save beside it is newer."""
    last = max(lasts, key=lambda c: (c.written, c.name))
    for c in lasts:
        if c is not last:
            skipped.append(Skipped(name=c.name, reason=Reason.OLDER_LAST, says=f"an older Lightning last checkpoint than {last.name}"))
    newer = max(usable, key=lambda c: (c.written, c.name), default=None)
    if newer is not None and newer.written > last.written + CLOCK_SLACK_SECONDS:
        skipped.append(Skipped(name=last.name, reason=Reason.STALE_LAST, says=f"older than {newer.name}: Lightning's last save is stale"))
        return None
    for c in usable:
        says = f"older than Lightning's {last.name}, the newest save by definition"
        skipped.append(Skipped(name=c.pick, reason=Reason.OLDER_THAN_LAST, says=says))
    return last


def _chosen(
    c: Candidate,
    usable: list[Candidate],
    skipped: list[Skipped],
    tracker: Tracker | None,
    tracked: Entry | None,
    lightning: bool = False,
    trajectory: Followed | None = None,
) -> Choice:
    """The choice of `c`, with why: its step among the usable ones, what its content says, what a tracker says."""
    said = _group_why(c.contents) if c.parts else _content_why(c.content)
    lines = [s.line() for s in skipped]
    if lightning:
        why = f"Lightning's {c.name}, the newest save by definition; {said}"
        return Choice(name=c.name, step=None, why=why, skipped=lines, skips=skipped, content=said)
    step = None if tracked is not None and tracked.name == c.name == "release" else (c.step or 0)
    kind = "usable checkpoint(s)" + ("; this one in parts: " + " + ".join(c.parts) if c.parts else "")
    if step is None:
        why = "Megatron's converted `release` checkpoint"
    elif trajectory is not None and trajectory.why:
        why = f"{trajectory.why} (step {step}) of {len(usable)} {kind}"
    elif len(c.order) > 1:
        numbers = ", ".join(map(str, c.order))
        why = f"last in the run's order ({numbers}: an epoch's or a stage's number before the step {step}) of {len(usable)} {kind}"
    else:
        why = f"highest step ({step}) of {len(usable)} {kind}"
    if trajectory is not None and trajectory.note:
        why += f"; {trajectory.note}"
    why += f"; {said}"
    if tracker is not None:
        agrees = tracked is not None and tracked.name == c.name
        why += f"; {tracker.label} names {'it' if agrees else tracker.names} as the newest complete save"
        if not agrees:
            why += f" ({next((s.says for s in skipped if s.name == tracker.names), 'not taken')})"
    return Choice(
        name=c.pick,
        step=step,
        why=why,
        skipped=lines,
        skips=skipped,
        parts=c.parts,
        tracker=tracker.label if tracker else None,
        content=said,
    )


def _nothing(entries: list[Entry], ignore: set[str], skipped: list[Skipped]) -> Choice:
    """No candidate left: start from scratch where only harmless names were skipped, else ask a person."""
    lines = [s.line() for s in skipped]
    if any(s.reason not in HARMLESS for s in skipped):
        held = sum(1 for e in entries if e.name not in ignore)
        problem = f"it holds {held} name(s) and no checkpoint relaunch can resume from"
        return Choice(why=problem, skipped=lines, skips=skipped, escalate=problem, blocked_by="nothing_usable")
    why = "no usable checkpoint: starting from scratch" if entries else "checkpoint_dir is empty: starting from scratch"
    return Choice(why=why, skipped=lines, skips=skipped)


def _unknown(c: Content | None) -> bool:
    return c is None or c.state == "unknown"


def _content_why(c: Content | None) -> str:
    """What a choice's reasons say of its content."""
    if c is None:
        return "content not read (not among the newest entries): judged by time"
    if c.state == "unknown":
        return f"format unknown ({c.detail}): judged by time"
    return c.says()


def _group_why(cs: list[Content | None]) -> str:
    if all(c is not None and c.state == "complete" for c in cs):
        return f"every part complete by its format ({', '.join(sorted({c.format for c in cs if c}))})"
    return "format of its parts not all known: judged by time"


def _as_folder(choice: Choice, loader_takes: str | None, tracker: Tracker | None, skipped: list[Skipped]) -> Choice:
    """With `resume_from: folder` the trainer gets checkpoint_dir and its loader takes what it takes: say which, or escalate."""
    how = f"its loader reads {tracker.label}" if tracker else "no tracker: its loader's own pick is taken to be the highest step there"
    if loader_takes == choice.name:
        choice.why += f"; resume_from: folder: the trainer is given checkpoint_dir, {how}, and will take {choice.name}, as relaunch chose"
        return choice
    ruled_out = next((s.says for s in skipped if s.name == loader_takes or s.name.startswith(f"{loader_takes} + ")), "not taken")
    problem = (
        f"resume_from: folder: the trainer is given checkpoint_dir and {how}, so it would take {loader_takes}, which relaunch "
        f"ruled out ({ruled_out}); relaunch cannot make it load {choice.name} instead"
    )
    return choice.model_copy(update={"escalate": problem, "why": problem, "blocked_by": "loader"})
