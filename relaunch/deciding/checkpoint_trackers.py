"""Framework trackers: Megatron's `latest_checkpointed_iteration.txt`, DeepSpeed's `latest` file, a `latest` link. Each
names the newest *complete* save (it is written after the save); anything of its series above it never finished."""

from __future__ import annotations

import os

from pydantic import BaseModel

from relaunch.deciding.checkpoint_names import name_problem, step_of
from relaunch.deciding.checkpoint_reasons import HARMLESS, Reason
from relaunch.plans.checkpoint_listing import Entry

MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
LATEST = "latest"
TRACKER_FILES = frozenset({MEGATRON_TRACKER, LATEST})


class Tracker(BaseModel):
    file: str
    says: str
    names: str | None = None
    problem: str | None = None

    @property
    def label(self) -> str:
        return f"{self.file} ({self.says!r})"


def trackers(names: dict[str, Entry], links: dict[str, str], contents: dict[str, str]) -> list[Tracker]:
    """Each framework tracker in the folder, with the entry it names or the problem with it."""
    found = []
    if MEGATRON_TRACKER in contents:
        says = contents[MEGATRON_TRACKER].strip()
        t = Tracker(file=MEGATRON_TRACKER, says=says)
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
        t = Tracker(file=LATEST, says=says)
        t.names = says if says and "/" not in says and says in names else None
        t.problem = None if t.names else "names no entry that checkpoint_dir holds"
        found.append(t)
    if LATEST in links:
        says = links[LATEST]
        base = os.path.basename(os.path.normpath(says)) if says else ""
        t = Tracker(file=f"{LATEST} (a symbolic link)", says=says)
        t.names = base if base in names else None
        t.problem = None if t.names else "points to nothing checkpoint_dir holds"
        found.append(t)
    for t in found:
        problem = name_problem(names[t.names]) if t.names else None
        if problem and problem.reason in HARMLESS | {Reason.NOT_A_FILE}:
            t.problem, t.names = f"names {t.names}, which is {problem.says}", None
    return found
