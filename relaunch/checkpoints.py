"""Which checkpoint a relaunch resumes from: a pure choice over the folder's listing, with its reasons.

The host only lists (NUL-separated, so no name is ever split); numbers are compared here as base-10
integers. Bash once read `step_000800` as octal, failed, counted it as 0 and resumed 200 steps back.

Three things can make the highest step the wrong one, and each is read from the listing:
- a framework tracker names the newest *complete* save (Megatron's `latest_checkpointed_iteration.txt`,
  DeepSpeed's `latest` file, a `latest` link); anything of its series above it is a save that never finished;
- a save still being written when a stop had to SIGKILL the trainer, or when a signal from outside killed it,
  is cut short wherever it was: it is the newest save whose last write falls inside that death (a trainer writes
  one at a time, so at most one per death; the ones before it are complete), and it is not taken unless a
  tracker names it complete;
- a checkpoint that failed to load once (recorded in the state folder), or one written after the step a
  divergence began.
A folder that holds names but nothing usable is a question for a person (`Choice.escalate`), never a silent
run from scratch whose new `step_60.pt` would then become "newest" over the work it could not read.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from typing import Literal

from pydantic import BaseModel, Field

from relaunch.runfiles import number_or_none

# Extensions of single-file checkpoints; a folder checkpoint has none.
EXTENSIONS = re.compile(r"\.(pt|pth|ckpt|bin|safetensors|tar|pkl|pickle|distcp|zip|npz|msgpack|h5|index)$", re.IGNORECASE)
# The whole name must be a checkpoint name ending in its step number: `step_600`, `iter_0000900`,
# `checkpoint-900`, `global_step900`, `epoch_3_step_900.pt`, orbax's bare `900`. `step_999 (copy)` is somebody's copy.
NAME = re.compile(r"^(?P<series>(?:[A-Za-z][A-Za-z0-9_.=-]*?)?)(?P<number>\d+)$")
# One part of a checkpoint saved as a file per part: `step_1000_model.pt` beside `step_1000_optim.pt`.
PART = re.compile(r"^(?P<series>(?:[A-Za-z][A-Za-z0-9_.=-]*?)?)(?P<number>\d+)[_.-](?P<part>[A-Za-z][A-Za-z0-9]*)$")
# Written while saving, renamed when complete (HF `tmp-checkpoint-900`, `step_600.tmp`, `.partial`).
UNFINISHED = re.compile(r"(^|[._-])(tmp|temp|partial|incomplete|inprogress|in_progress|writing)([._-]|\d|$)", re.IGNORECASE)

MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
LATEST = "latest"
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
# Reasons that cannot hide a real checkpoint: with only these in the folder, starting from scratch loses nothing.
HARMLESS = ("hidden", "an unfinished save", "empty")


class Entry(BaseModel):
    """One name in checkpoint_dir, as the host listed it."""

    name: str
    kind: str = Field(description="`f` file, `d` folder, `l` link, as find's %y prints it.")
    mtime: float = Field(description="Seconds since the epoch (the entry's own; a refusal is recorded with it).")
    empty: bool = Field(False, description="An empty file or folder: a save that never wrote.")
    newest: float | None = Field(None, description="A folder's newest write: the newest mtime of anything in it, a few levels down.")

    @property
    def written(self) -> float:
        """When the entry was last written: a file growing inside a folder leaves the folder's own mtime alone."""
        return max(self.mtime, self.newest) if self.newest is not None else self.mtime


class RunFacts(BaseModel):
    """What the current run's folder (STATE/runs/ID) says about how it ended."""

    run_id: str | None = None
    started_at: float | None = None
    stop_term_at: float | None = Field(None, description="When a stop sent its SIGTERMs.")
    stop_killed_at: float | None = Field(None, description="When that stop had to SIGKILL what was left.")
    exit_code: int | None = None
    exit_at: float | None = Field(None, description="When the trainer died: the mtime of its exit_code.")

    @property
    def death_at(self) -> float | None:
        return self.exit_at if self.exit_at is not None else self.stop_killed_at


class Listing(BaseModel):
    """Everything list_checkpoints.sh reports, read."""

    present: bool = True
    entries: list[Entry] = Field(default_factory=list)
    refused: set[tuple[int, str]] = Field(default_factory=set, description="(whole-second mtime, name) that failed to load once.")
    links: dict[str, str] = Field(default_factory=dict, description="Symbolic link name -> where it points.")
    contents: dict[str, str] = Field(default_factory=dict, description="Tracker file name -> its first line.")
    run: RunFacts = Field(default_factory=RunFacts)


class Choice(BaseModel):
    """The checkpoint chosen, and what a person reads about why."""

    name: str | None = Field(None, description="Chosen entry, or None: start from scratch.")
    step: int | None = None
    why: str = ""
    skipped: list[str] = Field(default_factory=list, description="Names not taken, each with its reason.")
    parts: list[str] = Field(default_factory=list, description="The files of a checkpoint saved as one file per part.")
    tracker: str | None = Field(None, description="The framework tracker that named the choice, and what it says.")
    escalate: str | None = Field(None, description="Why no choice may be made without a person: set, nothing is launched.")
    blocked_by: Literal["nothing_usable", "tracker", "loader"] | None = Field(
        None, description="What escalates: names but nothing usable, a tracker's word, or what a folder loader would take."
    )


def step_of(name: str) -> int | None:
    """The step number a checkpoint's name carries (base 10, zero-padding ignored), or None."""
    m = NAME.match(EXTENSIONS.sub("", name))
    return int(m["number"], 10) if m else None


def series_of(name: str) -> str | None:
    """What a checkpoint's name says besides its step: `iter_` of `iter_0000040`, `global_step` of `global_step900`."""
    m = NAME.match(EXTENSIONS.sub("", name))
    return m["series"] if m else None


def skip_reason(entry: Entry) -> str | None:
    if entry.name.startswith("."):
        return "hidden"
    if UNFINISHED.search(entry.name):
        return "an unfinished save"
    if entry.empty:
        return "empty"
    if entry.kind not in ("f", "d", "l"):
        return "not a file or folder"
    if step_of(entry.name) is None:
        return "not a checkpoint name ending in its step number"
    return None


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


def _is_save(name: str) -> bool:
    """A name a trainer's save leaves, finished or not (`step_20.pt`, `.step_20.pt.tmp`, `tmp-checkpoint-20`): of
    these the newest is the one a death cut short; a log or notes file written beside them says nothing of it."""
    return step_of(name.lstrip(".")) is not None or UNFINISHED.search(name) is not None


class _Tracker(BaseModel):
    file: str
    says: str
    names: str | None = None
    problem: str | None = None

    @property
    def label(self) -> str:
        return f"{self.file} ({self.says!r})"


def _trackers(names: dict[str, Entry], links: dict[str, str], contents: dict[str, str]) -> list[_Tracker]:
    """Each framework tracker in the folder, with the entry it names or the problem with it."""
    found = []
    if MEGATRON_TRACKER in contents:
        says = contents[MEGATRON_TRACKER].strip()
        t = _Tracker(file=MEGATRON_TRACKER, says=says)
        if says == "release":
            t.names = "release" if "release" in names else None
            t.problem = None if t.names else "says `release`, but checkpoint_dir has no `release` folder"
        elif says.isdigit():
            number = int(says, 10)
            exact = f"iter_{number:07d}"
            # Megatron-DeepSpeed names its folders global_stepN beside the same tracker.
            same = [n for n in names if step_of(n) == number]
            t.names = exact if exact in names else (same[0] if len(same) == 1 else None)
            if t.names is None:
                t.problem = f"names iteration {number}, but checkpoint_dir holds no {exact}" + (
                    f" (and {len(same)} other names of step {number}: {', '.join(sorted(same))})" if same else ""
                )
        else:
            t.problem = "holds neither an iteration number nor `release`"
        found.append(t)
    if LATEST in contents:
        says = contents[LATEST].strip()
        t = _Tracker(file=LATEST, says=says)
        t.names = says if says and "/" not in says and says in names else None
        t.problem = None if t.names else "names no entry that checkpoint_dir holds"
        found.append(t)
    if LATEST in links:
        says = links[LATEST]
        base = os.path.basename(os.path.normpath(says)) if says else ""
        t = _Tracker(file=f"{LATEST} (a symbolic link)", says=says)
        t.names = base if base in names else None
        t.problem = None if t.names else "points to nothing checkpoint_dir holds"
        found.append(t)
    for t in found:
        if t.names and (reason := skip_reason(names[t.names])) in HARMLESS + ("not a file or folder",):
            t.problem, t.names = f"names {t.names}, which is {reason}", None
    return found


def _groups(entries: list[Entry]) -> dict[tuple[str, int], list[Entry]]:
    """Checkpoints saved as one file per part (`step_1000_model.pt` + `step_1000_optim.pt`): (series, step) -> its files."""
    groups: dict[tuple[str, int], list[Entry]] = defaultdict(list)
    parts: dict[tuple[str, int], set[str]] = defaultdict(set)
    for e in entries:
        m = PART.match(EXTENSIONS.sub("", e.name))
        if m and e.kind == "f" and step_of(e.name) is None:
            key = (m["series"], int(m["number"], 10))
            groups[key].append(e)
            parts[key].add(m["part"])
    # One file alone is no group: `step_1000_final.pt` is a name relaunch cannot read, as before.
    return {key: members for key, members in groups.items() if len(parts[key]) > 1}


def _listed(members: list[Entry]) -> str:
    """How a checkpoint saved as one file per part is named in the reasons: its files, joined."""
    return " + ".join(sorted(m.name for m in members))


def choose(
    entries: list[Entry],
    refused: set[tuple[int, str]] | None = None,
    before_step: int | None = None,
    *,
    links: dict[str, str] | None = None,
    contents: dict[str, str] | None = None,
    run: RunFacts | None = None,
    resume_from: Literal["entry", "folder"] = "entry",
) -> Choice:
    """The highest step number wins; equal steps go to the newest. `refused` (mtime in whole seconds, name)
    entries failed to load once and are never taken again; a newer file under the same name is.

    A tracker's word beats the highest step; a save the current run's end may have cut short is skipped; with
    `resume_from="folder"` the trainer's loader picks for itself, so a choice it would not make escalates.
    """
    refused, links, contents = refused or set(), links or {}, contents or {}
    names = {e.name: e for e in entries}
    trackers = _trackers(names, links, contents)
    tracker_files = {MEGATRON_TRACKER, LATEST} & (set(contents) | set(links))
    if broken := [t for t in trackers if t.problem]:
        problem = "; ".join(f"its tracker {t.label} {t.problem}" for t in broken)
        return Choice(
            why=problem, escalate=f"{problem}: relaunch does not guess which checkpoint the framework would load", blocked_by="tracker"
        )
    if len({t.names for t in trackers}) > 1:
        problem = "its trackers disagree: " + ", ".join(f"{t.label} names {t.names}" for t in trackers)
        return Choice(why=problem, escalate=problem, blocked_by="tracker")
    tracker = trackers[0] if trackers else None
    tracked = names[tracker.names] if tracker and tracker.names else None
    tracked_step, tracked_series = (step_of(tracked.name), series_of(tracked.name)) if tracked else (None, None)
    groups = _groups(entries)
    in_group = {m.name: key for key, members in groups.items() for m in members}
    # A tracker names its checkpoint, and the ones of its series before it, complete: it is written after the save.
    suspects: dict[str, str] = {}
    if tracked is None:
        saves = {e.name: e.written for e in entries if e.name not in tracker_files and e.name not in in_group and _is_save(e.name)}
        saves |= {_listed(members): max(m.written for m in members) for members in groups.values()}
        suspects = cut_short(saves, run)

    candidates: list[tuple[int, float, str]] = []
    skipped: list[tuple[str, str]] = []
    loader_pick: tuple[int, str] | None = None  # what a loader reading the folder itself would take
    for entry in sorted(entries, key=lambda e: e.name):
        if entry.name in tracker_files:
            continue
        reason = skip_reason(entry)
        if entry is tracked and entry.name == "release":
            reason = None
        if reason == "not a checkpoint name ending in its step number" and entry.name in in_group:
            continue  # judged with the rest of its group below
        step = step_of(entry.name)
        if reason is None and tracker is None:
            loader_pick = max(loader_pick or (step or 0, entry.name), (step or 0, entry.name))
        if reason is None and tracked is not None and entry is not tracked:
            if series_of(entry.name) != tracked_series or tracked_step is None:
                reason = f"not of the series {tracker.label} tracks"  # type: ignore[union-attr]
            elif step is not None and step > tracked_step:
                reason = f"newer than what {tracker.label} names complete: a save that never finished"  # type: ignore[union-attr]
        if reason is None and (int(entry.mtime), entry.name) in refused:
            reason = "failed to load in an earlier attempt (recorded in the state folder; kept, never deleted)"
        reason = reason or suspects.get(entry.name)
        if reason is None and before_step is not None and step is not None and step >= before_step:
            reason = f"written at or after step {before_step}"
        if reason:
            skipped.append((entry.name, reason))
            continue
        candidates.append((step or 0, entry.mtime, entry.name))

    parts_of: dict[str, list[str]] = {}
    for (_, step), members in sorted(groups.items()):
        files = [m.name for m in sorted(members, key=lambda m: m.name)]
        listed = _listed(members)
        reason = next((r for m in members if (r := skip_reason(m)) in HARMLESS), None)
        reason = reason or next(
            (f"{m.name}: failed to load in an earlier attempt" for m in members if (int(m.mtime), m.name) in refused), None
        )
        reason = reason or suspects.get(listed)
        if reason is None and tracker is not None:
            reason = f"not of the series {tracker.label} tracks"
        if reason is None and before_step is not None and step >= before_step:
            reason = f"written at or after step {before_step}"
        if reason is None and resume_from == "entry":
            reason = (
                f"step {step}'s checkpoint saved as {len(files)} files: `{{checkpoint}}` names one path, so relaunch cannot pass it "
                "(resume_from: folder gives the trainer checkpoint_dir)"
            )
        if tracker is None and not any(skip_reason(m) in HARMLESS for m in members):
            loader_pick = max(loader_pick or (step, files[0]), (step, files[0]))
        if reason:
            skipped.append((listed, reason))
            continue
        candidates.append((step, max(m.mtime for m in members), files[0]))
        parts_of[files[0]] = files

    said = [f"{name!r}: {reason}" for name, reason in skipped]
    if not candidates:
        if any(not reason.startswith(HARMLESS) for _, reason in skipped):
            held = sum(1 for e in entries if e.name not in tracker_files)
            problem = f"it holds {held} name(s) and no checkpoint relaunch can resume from"
            return Choice(why=problem, skipped=said, escalate=problem, blocked_by="nothing_usable")
        why = "no usable checkpoint: starting from scratch" if entries else "checkpoint_dir is empty: starting from scratch"
        return Choice(why=why, skipped=said)
    top, _, name = max(candidates)
    step = None if name == "release" and tracked is not None and tracked.name == name else top
    kind = "usable checkpoint(s)" if not parts_of.get(name) else "usable checkpoint(s); this one in parts: " + " + ".join(parts_of[name])
    why = f"highest step ({step}) of {len(candidates)} {kind}" if step is not None else "Megatron's converted `release` checkpoint"
    if tracker is not None:
        agrees = tracked is not None and tracked.name == name
        why += f"; {tracker.label} names {'it' if agrees else tracker.names} as the newest complete save"
        if not agrees:
            why += f" ({dict(skipped).get(tracker.names or '', 'not taken')})"
    choice = Choice(name=name, step=step, why=why, skipped=said, parts=parts_of.get(name, []), tracker=tracker.label if tracker else None)
    if resume_from == "folder":
        return _as_folder(choice, tracked.name if tracked else (loader_pick[1] if loader_pick else None), tracker, dict(skipped))
    return choice


def _as_folder(choice: Choice, loader_takes: str | None, tracker: _Tracker | None, skipped: dict[str, str]) -> Choice:
    """With `resume_from: folder` the trainer gets checkpoint_dir and its loader takes what it takes: say which, or escalate."""
    how = f"its loader reads {tracker.label}" if tracker else "no tracker: its loader's own pick is taken to be the highest step there"
    if loader_takes == choice.name:
        choice.why += f"; resume_from: folder: the trainer is given checkpoint_dir, {how}, and will take {choice.name}, as relaunch chose"
        return choice
    ruled_out = next((r for n, r in skipped.items() if n == loader_takes or n.startswith(f"{loader_takes} + ")), "not taken")
    problem = (
        f"resume_from: folder: the trainer is given checkpoint_dir and {how}, so it would take {loader_takes}, which relaunch "
        f"ruled out ({ruled_out}); relaunch cannot make it load {choice.name} instead"
    )
    return choice.model_copy(update={"escalate": problem, "why": problem, "blocked_by": "loader"})


def parse_listing(stdout: str) -> list[Entry]:
    """The entries of a listing: `find -printf '%y %T@ E|N %f\\0'` records; a name may hold anything but NUL and `/`."""
    return read_listing(stdout).entries


def read_listing(stdout: str) -> Listing:
    """Every record list_checkpoints.sh prints (see its header), after its `present`/`missing` line if any."""
    head, newline, rest = stdout.partition("\n")
    if head.strip() in ("present", "missing") and "\0" not in head:
        if head.strip() == "missing":
            return Listing(present=False)
        stdout = rest
    elif not newline:
        stdout = head
    listing = Listing()
    newest: dict[str, float] = {}
    run: dict[str, str] = {}
    for record in stdout.split("\0"):
        tag, _, body = record.partition(" ")
        if tag == "S":
            mtime, _, name = body.partition(" ")
            if mtime.isdigit() and name:
                listing.refused.add((int(mtime), name))
        elif tag == "W":
            value, _, name = body.partition(" ")
            if (number := number_or_none(value, float)) is not None and name:
                newest[name] = number
        elif tag in ("L", "C"):
            name, slash, value = body.partition("/")
            if slash and name:
                (listing.links if tag == "L" else listing.contents)[name] = value
        elif tag == "R":
            key, _, value = body.partition(" ")
            run[key] = value.strip()
        elif len(tag) == 1:
            parts = body.split(" ", 2)
            if len(parts) == 3 and parts[2] and (mtime := number_or_none(parts[0], float)) is not None:
                listing.entries.append(Entry(name=parts[2], kind=tag, mtime=mtime, empty=parts[1] == "E"))
    for entry in listing.entries:
        entry.newest = newest.get(entry.name)
    code = run.get("exit_code", "")
    listing.run = RunFacts(
        run_id=run.get("run") or None,
        started_at=number_or_none(run.get("started_at"), float),
        stop_term_at=number_or_none(run.get("stop_term_at"), float),
        stop_killed_at=number_or_none(run.get("stop_killed_at"), float),
        exit_code=int(code) if code.lstrip("-").isdigit() else None,
        exit_at=number_or_none(run.get("exit_at"), float),
    )
    return listing
