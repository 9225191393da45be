"""The grammar of checkpoint names: which names are saves, the step number a name carries (base 10: bash once read
`step_000800` as octal and resumed 200 steps back), the series it belongs to, and checkpoints saved as one file per part.
"""

from __future__ import annotations

import re
from collections import defaultdict

from relaunch.deciding.checkpoint_reasons import Reason, Skip
from relaunch.plans.checkpoint_listing import Entry

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


def counters(series: str) -> tuple[int, ...]:
    """The numbers a series holds besides its step, in order: an epoch's, a stage's (`epoch_3_step_`, `stage2_step_`,
    Lightning's `epoch=3-step=`); a decimal's digits (`loss0.53_step_`) are none."""
    return tuple(int(t, 10) for t in re.findall(r"\d+(?:\.\d+)*", series) if "." not in t)


def standing(name: str) -> tuple[str, tuple[int, ...]] | None:
    """A save's series and where it stands in its run's order by its name: its series' counters, then its step. An
    epoch loop whose step starts again each epoch writes `epoch_4_step_20.pt` after `epoch_3_step_30.pt`, and
    (4, 20) > (3, 30); a file of a checkpoint in parts stands where its checkpoint does. None for a name with no step."""
    stem = EXTENSIONS.sub("", name)
    m = NAME.match(stem) if not_a_step(name) is None else None
    if m is None and step_of(name) is None:
        m = PART.match(stem)
    return (m["series"], (*counters(m["series"]), int(m["number"], 10))) if m else None


def order_of(name: str) -> tuple[int, ...] | None:
    """Where a save stands in its run's order by its name (see `standing`), or None."""
    found = standing(name)
    return found[1] if found else None


def series_key(series: str) -> str:
    """A series with its other numbers as `#`: Lightning's `epoch=3-step=` and `epoch=4-step=` are one series."""
    return re.sub(r"\d+", "#", series)


def name_problem(entry: Entry) -> Skip | None:
    """Why an entry's name (or its kind, or its emptiness) makes it no checkpoint to resume from, or None."""
    if entry.name.startswith("."):
        return Skip(reason=Reason.HIDDEN, says="hidden")
    if UNFINISHED.search(entry.name):
        return Skip(reason=Reason.UNFINISHED, says="an unfinished save")
    if entry.empty:
        return Skip(reason=Reason.EMPTY, says="empty")
    if entry.kind not in ("f", "d", "l"):
        return Skip(reason=Reason.NOT_A_FILE, says="not a file or folder")
    if LIGHTNING_LAST.match(entry.name):
        return None
    if says := not_a_step(entry.name):
        return Skip(reason=Reason.NUMBER_NOT_A_STEP, says=says)
    if step_of(entry.name) is None:
        return Skip(reason=Reason.NOT_A_NAME, says="not a checkpoint name ending in its step number")
    return None


def skip_reason(entry: Entry) -> str | None:
    """What `name_problem` says, as a person reads it."""
    problem = name_problem(entry)
    return problem.says if problem else None


def is_save(name: str) -> bool:
    """A name a trainer's save leaves, finished or not (`step_20.pt`, `.step_20.pt.tmp`, `tmp-checkpoint-20`): of
    these the newest is the one a death cut short; a log or notes file written beside them says nothing of it."""
    return step_of(name.lstrip(".")) is not None or UNFINISHED.search(name) is not None


def part_groups(entries: list[Entry]) -> dict[tuple[str, int], list[Entry]]:
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


def listed(members: list[Entry]) -> str:
    """How a checkpoint saved as one file per part is named in the reasons: its files, joined."""
    return " + ".join(sorted(m.name for m in members))
