"""Which checkpoint a relaunch resumes from: a pure choice over the folder's listing, with its reasons.

The host only lists (NUL-separated, so no name is ever split); numbers are compared here as base-10
integers. Bash once read `step_000800` as octal, failed, counted it as 0 and resumed 200 steps back.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

# Extensions of single-file checkpoints; a folder checkpoint has none.
EXTENSIONS = re.compile(r"\.(pt|pth|ckpt|bin|safetensors|tar|pkl|pickle|distcp|zip|npz|msgpack|h5|index)$", re.IGNORECASE)
# The whole name must be a checkpoint name ending in its step number: `step_600`, `iter_0000900`,
# `checkpoint-900`, `global_step900`, `epoch_3_step_900.pt`, orbax's bare `900`. `step_999 (copy)` is somebody's copy.
NAME = re.compile(r"^(?:[A-Za-z][A-Za-z0-9_.=-]*?)?(?P<number>\d+)$")
# Written while saving, renamed when complete (HF `tmp-checkpoint-900`, `step_600.tmp`, `.partial`).
UNFINISHED = re.compile(r"(^|[._-])(tmp|temp|partial|incomplete|inprogress|in_progress|writing)([._-]|\d|$)", re.IGNORECASE)


class Entry(BaseModel):
    """One name in checkpoint_dir, as the host listed it."""

    name: str
    kind: str = Field(description="`f` file, `d` folder, `l` link, as find's %y prints it.")
    mtime: float = Field(description="Seconds since the epoch.")
    empty: bool = Field(False, description="An empty file or folder: a save that never wrote.")


class Choice(BaseModel):
    """The checkpoint chosen, and what a person reads about why."""

    name: str | None = Field(None, description="Chosen entry, or None: start from scratch.")
    step: int | None = None
    why: str = ""
    skipped: list[str] = Field(default_factory=list, description="Names not taken, each with its reason.")


def step_of(name: str) -> int | None:
    """The step number a checkpoint's name carries (base 10, zero-padding ignored), or None."""
    m = NAME.match(EXTENSIONS.sub("", name))
    return int(m["number"], 10) if m else None


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


def choose(entries: list[Entry], refused: set[tuple[int, str]] | None = None, before_step: int | None = None) -> Choice:
    """The highest step number wins; equal steps go to the newest. `refused` (mtime in whole seconds, name)
    entries failed to load once and are never taken again; a newer file under the same name is."""
    refused = refused or set()
    candidates: list[tuple[int, float, str]] = []
    skipped: list[str] = []
    for entry in sorted(entries, key=lambda e: e.name):
        reason = skip_reason(entry)
        if reason is None and (int(entry.mtime), entry.name) in refused:
            reason = "failed to load in an earlier attempt (recorded in the state folder; kept, never deleted)"
        step = step_of(entry.name)
        if reason is None and before_step is not None and step is not None and step >= before_step:
            reason = f"written at or after step {before_step}"
        if reason:
            skipped.append(f"{entry.name!r}: {reason}")
            continue
        candidates.append((step or 0, entry.mtime, entry.name))
    if not candidates:
        why = "no usable checkpoint: starting from scratch" if entries else "checkpoint_dir is empty: starting from scratch"
        return Choice(why=why, skipped=skipped)
    step, _, name = max(candidates)
    why = f"highest step ({step}) of {len(candidates)} usable checkpoint(s)"
    return Choice(name=name, step=step, why=why, skipped=skipped)


def parse_listing(stdout: str) -> list[Entry]:
    """`find -printf '%y %T@ E|N %f\\0'` records; a name may hold anything but NUL and `/`."""
    entries = []
    for record in stdout.split("\0"):
        parts = record.split(" ", 3)
        if len(parts) != 4 or not parts[3] or parts[0] == "S":
            continue
        kind, mtime, empty, name = parts
        try:
            entries.append(Entry(name=name, kind=kind, mtime=float(mtime), empty=empty == "E"))
        except ValueError:
            continue
    return entries
