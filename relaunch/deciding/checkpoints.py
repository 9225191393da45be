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
Before any of these, a checkpoint is judged by its content where its format is known (see `judge`): a torch.save zip,
a safetensors file, a DCP folder, a Hugging Face Trainer folder. A complete one is taken however close to a death it
was written; a cut one is skipped whoever killed the run and whenever. Only where the format is unknown does the timing
rule above decide, and the reasons say so. The host gathers the bytes (a few, of the newest entries only); no I/O here.
A folder that holds names but nothing usable is a question for a person (`Choice.escalate`), never a silent
run from scratch whose new `step_60.pt` would then become "newest" over the work it could not read.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import struct
from collections import defaultdict
from typing import Literal

from pydantic import BaseModel, Field

from relaunch.judging.logtext import number_or_none

# Extensions of single-file checkpoints; a folder checkpoint has none.
EXTENSIONS = re.compile(r"\.(pt|pth|ckpt|bin|safetensors|tar|pkl|pickle|distcp|zip|npz|msgpack|h5|index)$", re.IGNORECASE)
# The whole name must be a checkpoint name ending in its step number: `step_600`, `iter_0000900`,
# `checkpoint-900`, `global_step900`, `epoch_3_step_900.pt`, orbax's bare `900`. `step_999 (copy)` is somebody's copy.
NAME = re.compile(r"^(?P<series>(?:[A-Za-z][A-Za-z0-9_.=-]*?)?)(?P<number>\d+)$")
# One part of a checkpoint saved as a file per part: `step_1000_model.pt` beside `step_1000_optim.pt`.
# A rank's shard is a part too: `step_600_rank1.pt`, `iter_0000600_mp_rank_00.pt`, `ckpt-600.rank1.pt`.
PART = re.compile(r"^(?P<series>(?:[A-Za-z][A-Za-z0-9_.=-]*?)?)(?P<number>\d+)[_.-](?P<part>[A-Za-z][A-Za-z0-9_]*)$")
# A number after a rank or shard word numbers the rank or shard, not the step (`step_600_rank1`, `model-00001-of-00004`).
RANK_WORD = re.compile(r"(?:rank|shard|part|of|tp|pp|dp|ep|mp|worker|proc|process|device|gpu|node|replica)[_.-]?$", re.IGNORECASE)
# Written while saving, renamed when complete (HF `tmp-checkpoint-900`, `step_600.tmp`, `.partial`).
UNFINISHED = re.compile(r"(^|[._-])(tmp|temp|partial|incomplete|inprogress|in_progress|writing)([._-]|\d|$)", re.IGNORECASE)

# Lightning's ModelCheckpoint(save_last=True) writes `last.ckpt` (`last-v1.ckpt` beside an older one) after its top-k
# files: complete, it is the newest save by definition, though its name carries no step.
LIGHTNING_LAST = re.compile(r"^last(-v\d+)?\.ckpt$")
# A number that names its step: a step word before it makes any number one (`checkpoint-20261201`).
STEP_WORD = re.compile(r"(step|iter|checkpoint|ckpt|epoch|global)[_=.-]?$", re.IGNORECASE)

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


class Probe(BaseModel):
    """The bytes the host read of one file: its size, its first bytes and its last ones (`-` on the host: none read)."""

    size: int
    head: bytes = b""
    tail: bytes = b""
    read: bool = Field(True, description="False where the host listed only the size.")


class EntryProbe(BaseModel):
    """What the host read of one of the newest entries: the file itself (key ""), or the files of a folder by their
    path inside it; `crowded` where the folder held more files than were listed."""

    files: dict[str, Probe] = Field(default_factory=dict)
    crowded: bool = False


class Content(BaseModel):
    """What an entry's content says of it: `complete` (its format proves it whole), `cut` (its format proves it cut
    short or damaged: never resumed from), or `unknown` (no format relaunch can read: the timing rule judges it)."""

    state: Literal["complete", "cut", "unknown"]
    format: str
    detail: str

    def says(self) -> str:
        return f"{self.format}: {self.detail}"


ZIP_MAGIC, EOCD, ZIP64_LOCATOR, ZIP64_RECORD, CENTRAL = b"PK\x03\x04", b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06", b"PK\x01\x02"
TORCH = "torch zip (torch.save)"
SAFETENSORS = "safetensors"
DCP_FILE = re.compile(r"^__\d+_\d+\.distcp$")
UNKNOWN = "format unknown"


def _zip(p: Probe) -> Content:
    """A zip is whole when its end-of-central-directory record ends the file (its comment length agrees with the
    size) and the central directory it points to ends where the zip64 record, or the record itself, begins."""
    t, base = p.tail, p.size - len(p.tail)
    at = t.rfind(EOCD)
    while at >= 0:
        if at + 22 <= len(t):
            _, _, _, _, cd_size, cd_offset, comment = struct.unpack_from("<HHHHIIH", t, at + 4)
            if base + at + 22 + comment == p.size:
                loc = at - 20
                if loc >= 0 and t[loc : loc + 4] == ZIP64_LOCATOR:
                    _, record, _ = struct.unpack_from("<IQI", t, loc + 4)
                    r = record - base
                    if 0 <= r and r + 56 <= loc and t[r : r + 4] == ZIP64_RECORD:
                        (size,) = struct.unpack_from("<Q", t, r + 4)
                        cd_size, cd_offset = struct.unpack_from("<QQ", t, r + 40)
                        if r + 12 + size == loc and cd_offset + cd_size == record and _central_starts(t, base, cd_offset, cd_size):
                            return Content(state="complete", format=TORCH, detail="complete: its zip64 end records end the file and agree")
                elif cd_offset + cd_size == base + at and _central_starts(t, base, cd_offset, cd_size):
                    return Content(
                        state="complete", format=TORCH, detail="complete: its end-of-central-directory record ends the file and agrees"
                    )
        at = t.rfind(EOCD, 0, at)
    return Content(
        state="cut", format=TORCH, detail=f"cut short: no end-of-central-directory record ends its {p.size} bytes (the last {len(t)} read)"
    )


def _central_starts(t: bytes, base: int, offset: int, size: int) -> bool:
    """The central directory starts with its signature, where it lies inside the bytes read (else it is not judged)."""
    r = offset - base
    return size == 0 or r < 0 or t[r : r + 4] == CENTRAL


def _safetensors(p: Probe) -> Content:
    """8 bytes of header length (little-endian), a JSON header, then the data: the largest `data_offsets` end is
    where the file ends."""
    if p.size < 8 or len(p.head) < 8:
        return Content(state="cut", format=SAFETENSORS, detail=f"cut short: {p.size} bytes, fewer than its 8-byte header length")
    (n,) = struct.unpack_from("<Q", p.head)
    if 8 + n > p.size:
        return Content(state="cut", format=SAFETENSORS, detail=f"cut short: its {n}-byte header runs past its {p.size} bytes")
    if len(p.head) < 8 + n:
        return Content(state="unknown", format=SAFETENSORS, detail=f"its {n}-byte header was not read (too large)")
    try:
        header = json.loads(p.head[8 : 8 + n].decode())
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return Content(state="cut", format=SAFETENSORS, detail="damaged: its header does not parse as a safetensors header")
    want = 8 + n + max(ends, default=0)
    if want != p.size:
        how = "cut short" if want > p.size else "damaged"
        return Content(state="cut", format=SAFETENSORS, detail=f"{how}: {p.size} bytes where its header describes {want}")
    return Content(state="complete", format=SAFETENSORS, detail=f"complete: {len(ends)} tensor(s), the file ends where its header says")


def judge_file(name: str, p: Probe) -> Content:
    """A file by its own bytes: safetensors by its name, a zip by its first bytes; anything else is unknown."""
    if not p.read:
        return Content(state="unknown", format=UNKNOWN, detail="its bytes were not read")
    if name.endswith(".safetensors"):
        return _safetensors(p)
    if p.head.startswith(ZIP_MAGIC):
        return _zip(p)
    if p.head and p.size < 22 and ZIP_MAGIC.startswith(p.head[:4]):
        return Content(state="cut", format=TORCH, detail=f"cut short: {p.size} bytes of a zip's start, smaller than any whole zip")
    return Content(state="unknown", format=UNKNOWN, detail="neither a zip (torch.save) nor safetensors")


def _parses(p: Probe) -> bool | None:
    """True if a JSON file parses, False if not, None if its bytes were not read (too large)."""
    if p.size == 0:
        return False
    if not p.read or len(p.head) < p.size:
        return None
    try:
        json.loads(p.head.decode())
    except ValueError:
        return False
    return True


def judge_folder(probe: EntryProbe) -> Content:
    """A folder by its layout: DCP, a Hugging Face Trainer save; in any folder, a file of a known format that is cut
    makes it cut. A folder of no known layout is unknown: whole files do not prove that every file was written."""
    files = probe.files
    top = {rel: p for rel, p in files.items() if "/" not in rel}
    known = {rel: judge_file(rel.rsplit("/", 1)[-1], p) for rel, p in files.items() if not rel.endswith(".json") and p.read}
    cut = next(((rel, c) for rel, c in sorted(known.items()) if c.state == "cut"), None)
    whole = sum(1 for c in known.values() if c.state == "complete")
    shards = sorted(rel for rel in top if DCP_FILE.match(rel))
    if ".metadata" in top or shards:
        fmt = "DCP folder (torch.distributed.checkpoint)"
        if cut:
            return Content(state="cut", format=fmt, detail=f"cut short: its {cut[0]} is ({cut[1].detail})")
        if ".metadata" not in top or top[".metadata"].size == 0:
            return Content(state="cut", format=fmt, detail=f"cut short: {len(shards)} __N_M.distcp file(s) and no .metadata (written last)")
        if not shards:
            return Content(state="cut", format=fmt, detail="cut short: .metadata without any __N_M.distcp file")
        return Content(state="complete", format=fmt, detail=f"complete: .metadata and {len(shards)} __N_M.distcp file(s)")
    if "trainer_state.json" in top:
        fmt = "Hugging Face Trainer folder"
        if cut:
            return Content(state="cut", format=fmt, detail=f"cut short: its {cut[0]} is ({cut[1].detail})")
        parsed = _parses(top["trainer_state.json"])
        if parsed is None:
            return Content(state="unknown", format=fmt, detail="its trainer_state.json was not read (too large)")
        if not parsed:
            return Content(state="cut", format=fmt, detail="cut short: its trainer_state.json does not parse")
        named = 0
        for rel in sorted(r for r in top if r.endswith(".index.json")):
            ok = _parses(top[rel])
            if not ok:
                state = "unknown" if ok is None else "cut"
                return Content(state=state, format=fmt, detail=f"its {rel} {'was not read' if ok is None else 'does not parse'}")
            weight_map = json.loads(top[rel].head.decode()).get("weight_map", {})
            for shard in sorted(set(weight_map.values()) if isinstance(weight_map, dict) else ()):
                named += 1
                if str(shard) not in files or files[str(shard)].size == 0:
                    if probe.crowded and str(shard) not in files:
                        return Content(state="unknown", format=fmt, detail=f"{shard} (named by {rel}) not among the files listed")
                    missing = "missing" if str(shard) not in files else "empty"
                    return Content(state="cut", format=fmt, detail=f"cut short: {shard}, named by {rel}, is {missing}")
        return Content(
            state="complete",
            format=fmt,
            detail=f"complete: trainer_state.json parses, the {named} file(s) its index names are there, {whole} file(s) whole by their format",
        )
    if cut:
        return Content(state="cut", format=f"folder of {cut[1].format} files", detail=f"cut short: its {cut[0]} is ({cut[1].detail})")
    return Content(state="unknown", format=UNKNOWN, detail="a folder of no layout relaunch can read (DCP or Hugging Face Trainer)")


def judge(entry: Entry, probe: EntryProbe | None) -> Content | None:
    """An entry by its content, or None where the host read none of it (not among the newest)."""
    if probe is None or not probe.files:
        return None
    if entry.kind == "f" or (entry.kind == "l" and "" in probe.files):
        return judge_file(entry.name, probe.files[""]) if "" in probe.files else None
    return judge_folder(probe)


class Listing(BaseModel):
    """Everything list_checkpoints.sh reports, read."""

    present: bool = True
    entries: list[Entry] = Field(default_factory=list)
    refused: set[tuple[int, str]] = Field(default_factory=set, description="(whole-second mtime, name) that failed to load once.")
    links: dict[str, str] = Field(default_factory=dict, description="Symbolic link name -> where it points.")
    contents: dict[str, str] = Field(default_factory=dict, description="Tracker file name -> its first line.")
    probes: dict[str, EntryProbe] = Field(default_factory=dict, description="Entry name -> the bytes read of the newest entries.")
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
    content: str | None = Field(None, description="What its content says: complete by its format, or judged by time.")
    blocked_by: Literal["nothing_usable", "tracker", "loader"] | None = Field(
        None, description="What escalates: names but nothing usable, a tracker's word, or what a folder loader would take."
    )


def _is_date(digits: str) -> str | None:
    """`2026-12-01` for 20261201 (and 2026120115, 202612011530, 20261201153000: hours, minutes, seconds), else None."""
    if len(digits) not in (8, 10, 12, 14) or not digits.startswith(("19", "20")):
        return None
    year, month, day = int(digits[:4]), int(digits[4:6]), int(digits[6:8])
    clock = [int(digits[i : i + 2]) for i in range(8, len(digits), 2)]
    if not (1 <= month <= 12 and 1 <= day <= 31) or any(v > limit for v, limit in zip(clock, (23, 59, 59), strict=False)):
        return None
    return f"{year:04d}-{month:02d}-{day:02d}" + (" " + ":".join(f"{v:02d}" for v in clock) if clock else "")


def not_a_step(name: str) -> str | None:
    """Why a name that ends in a number does not name a step by it, or None: a date or a time (`run-20261201`,
    `run-2026-12-01`, `run-20261201-1530`), a version (`model_v3`, Lightning's `-v1`), a decimal (`lr0.001`)."""
    m = NAME.match(EXTENSIONS.sub("", name))
    if not m:
        return None
    series, number = m["series"], m["number"]
    if STEP_WORD.search(series):
        return None
    if re.search(r"\d", series) and RANK_WORD.search(series):
        return "its number is a rank's or a shard's, not a step"
    if date := _is_date(number):
        return f"its number is a date ({date}), not a step"
    if re.search(r"(^|[^0-9])(19|20)\d\d[-_.]?(0[1-9]|1[0-2])[-_.]?$", series) or re.search(r"(19|20)\d{6}[-_.T]?$", series):
        return "its number is part of a date or a time, not a step"
    if re.search(r"(^|[-_.])[vV]$", series):
        return "its number is a version, not a step"
    if re.search(r"\d\.$", series):
        return "its number is part of a decimal or a dotted version, not a step"
    return None


def step_of(name: str) -> int | None:
    """The step number a checkpoint's name carries (base 10, zero-padding ignored), or None (also for a number that
    is no step: a date, a version; see `not_a_step`)."""
    m = NAME.match(EXTENSIONS.sub("", name))
    return int(m["number"], 10) if m and not_a_step(name) is None else None


def series_of(name: str) -> str | None:
    """What a checkpoint's name says besides its step: `iter_` of `iter_0000040`, `global_step` of `global_step900`."""
    m = NAME.match(EXTENSIONS.sub("", name))
    return m["series"] if m and not_a_step(name) is None else None


def skip_reason(entry: Entry) -> str | None:
    if entry.name.startswith("."):
        return "hidden"
    if UNFINISHED.search(entry.name):
        return "an unfinished save"
    if entry.empty:
        return "empty"
    if entry.kind not in ("f", "d", "l"):
        return "not a file or folder"
    if LIGHTNING_LAST.match(entry.name):
        return None
    if reason := not_a_step(entry.name):
        return reason
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
    probes: dict[str, EntryProbe] | None = None,
) -> Choice:
    """The highest step number wins; equal steps go to the newest. `refused` (mtime in whole seconds, name)
    entries failed to load once and are never taken again; a newer file under the same name is.

    A tracker's word beats the highest step; a save the current run's end may have cut short is skipped; with
    `resume_from="folder"` the trainer's loader picks for itself, so a choice it would not make escalates.

    `probes`, the bytes the host read of the newest entries, come first: an entry whose format proves it cut is never
    taken (whatever a tracker or the clock says), one whose format proves it whole is never skipped for timing; only
    an entry of unknown format, or not read, is judged by the timing rule, and its reason says so. Lightning's
    `last.ckpt`, whole, is the newest save by definition.
    """
    refused, links, contents, probes = refused or set(), links or {}, contents or {}, probes or {}
    names = {e.name: e for e in entries}
    content = {e.name: c for e in entries if (c := judge(e, probes.get(e.name))) is not None}
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
        # The clock only judges what the content cannot: a save whose format is known is judged by it.
        suspects = {name: _by_time(why, content.get(name)) for name, why in suspects.items() if _unknown(content.get(name))}

    candidates: list[tuple[int, float, str]] = []
    written_of: dict[str, tuple[float, str]] = {}  # a candidate's newest write and its series
    lasts: list[Entry] = []
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
        known = content.get(entry.name)
        if reason is None and known is not None and known.state == "cut":
            reason = f"{known.says()}" + (f" (whatever {tracker.label} says)" if entry is tracked and tracker else "")
        reason = reason or suspects.get(entry.name)
        if reason is None and before_step is not None and step is not None and step >= before_step:
            reason = f"written at or after step {before_step}"
        if reason is None and before_step is not None and step is None and LIGHTNING_LAST.match(entry.name):
            reason = f"Lightning's {entry.name} names no step: not known to be before step {before_step}"
        if reason:
            skipped.append((entry.name, reason))
            continue
        if LIGHTNING_LAST.match(entry.name):
            lasts.append(entry)
            continue
        candidates.append((step or 0, entry.mtime, entry.name))
        written_of[entry.name] = (entry.written, series_of(entry.name) or "")

    parts_of: dict[str, list[str]] = {}
    for (series, step), members in sorted(groups.items()):
        files = [m.name for m in sorted(members, key=lambda m: m.name)]
        listed = _listed(members)
        reason = next((r for m in members if (r := skip_reason(m)) in HARMLESS), None)
        reason = reason or next(
            (f"{m.name}: failed to load in an earlier attempt" for m in members if (int(m.mtime), m.name) in refused), None
        )
        reason = reason or next((f"{m.name}: {c.says()}" for m in members if (c := content.get(m.name)) and c.state == "cut"), None)
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
        written_of[files[0]] = (max(m.written for m in members), series)
        parts_of[files[0]] = files

    if lasts:
        last = max(lasts, key=lambda e: (e.written, e.name))
        for e in lasts:
            if e is not last:
                skipped.append((e.name, f"an older Lightning last checkpoint than {last.name}"))
        newer = max(((names[n].written, n) for _, _, n in candidates), default=None)
        if newer is not None and newer[0] > last.written + CLOCK_SLACK_SECONDS:
            skipped.append((last.name, f"older than {newer[1]}: Lightning's last save is stale"))
        else:
            for _, _, other in candidates:
                skipped.append((other, f"older than Lightning's {last.name}, the newest save by definition"))
            said = [f"{name!r}: {reason}" for name, reason in skipped]
            why = f"Lightning's {last.name}, the newest save by definition; " + _content_why(content.get(last.name))
            choice = Choice(name=last.name, step=None, why=why, skipped=said, content=_content_why(content.get(last.name)))
            return (
                _as_folder(choice, loader_pick[1] if loader_pick else None, tracker, dict(skipped)) if resume_from == "folder" else choice
            )

    candidates = _own_series(candidates, written_of, skipped)
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
    said_content = _content_why(content.get(name)) if not parts_of.get(name) else _group_why([content.get(n) for n in parts_of[name]])
    why += f"; {said_content}"
    if tracker is not None:
        agrees = tracked is not None and tracked.name == name
        why += f"; {tracker.label} names {'it' if agrees else tracker.names} as the newest complete save"
        if not agrees:
            why += f" ({dict(skipped).get(tracker.names or '', 'not taken')})"
    choice = Choice(
        name=name,
        step=step,
        why=why,
        skipped=said,
        parts=parts_of.get(name, []),
        tracker=tracker.label if tracker else None,
        content=said_content,
    )
    if resume_from == "folder":
        return _as_folder(choice, tracked.name if tracked else (loader_pick[1] if loader_pick else None), tracker, dict(skipped))
    return choice


def _series_key(series: str) -> str:
    """A series with its other numbers as `#`: Lightning's `epoch=3-step=` and `epoch=4-step=` are one series."""
    return re.sub(r"\d+", "#", series)


def _own_series(
    candidates: list[tuple[int, float, str]], written_of: dict[str, tuple[float, str]], skipped: list[tuple[str, str]]
) -> list[tuple[int, float, str]]:
    """The candidates of the run's own series, the one its newest save is of: step numbers compare only within a
    series (`resnet50.pt`, a base model kept in checkpoint_dir, is not step 50 of the run writing `step_20.pt`). The
    others are said in `skipped`."""
    keys = {name: _series_key(written_of[name][1]) for _, _, name in candidates}
    if len(set(keys.values())) < 2:
        return candidates
    newest = max(candidates, key=lambda c: (written_of[c[2]][0], c[0], c[2]))[2]
    own = keys[newest]
    for _, _, name in candidates:
        if keys[name] != own:
            skipped.append(
                (
                    name,
                    f"of another series than the newest save's ({written_of[newest][1] or 'a bare number'}): its number is no step of the run's",
                )
            )
    return [c for c in candidates if keys[c[2]] == own]


def _unknown(c: Content | None) -> bool:
    return c is None or c.state == "unknown"


def _by_time(why: str, c: Content | None) -> str:
    """A timing reason, saying that the content could not judge it."""
    return f"{why}; {_content_why(c)}"


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


def _b64(text: str) -> bytes | None:
    try:
        return b"" if text == "-" else base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _probe(listing: Listing, body: str) -> None:
    """`P SIZE HEAD TAIL NAME[/PATH]`: HEAD and TAIL base64, `-` for none read."""
    parts = body.split(" ", 3)
    if len(parts) != 4 or not parts[0].isdigit():
        return
    head, tail = _b64(parts[1]), _b64(parts[2])
    name, _, rel = parts[3].partition("/")
    if head is None or tail is None or not name:
        return
    read = parts[0] == "0" or not (parts[1] == "-" and parts[2] == "-")
    listing.probes.setdefault(name, EntryProbe()).files[rel] = Probe(size=int(parts[0]), head=head, tail=tail, read=read)


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
        elif tag == "P":
            _probe(listing, body)
        elif tag == "T" and body:
            listing.probes.setdefault(body, EntryProbe()).crowded = True
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
