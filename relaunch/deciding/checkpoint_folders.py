"""A folder checkpoint judged by its content: a DCP folder, a Hugging Face Trainer folder, and a folder of no known
layout, judged by its files (each whole by its format) and by the series' previous save (the same files, of the same
sizes where a file's format cannot say). A cut file of a known format makes any folder cut."""

from __future__ import annotations

import json
import re
from collections import Counter

from relaunch.deciding.checkpoint_formats import UNKNOWN, Content, judge_file, parses
from relaunch.deciding.checkpoint_names import order_of, series_key, series_of
from relaunch.plans.checkpoint_listing import Entry, EntryProbe, Probe

DCP_FILE = re.compile(r"^__\d+_\d+\.distcp$")
DCP, HF = "DCP folder (torch.distributed.checkpoint)", "Hugging Face Trainer folder"


def _first_cut(files: dict[str, Probe], with_json: bool) -> tuple[str, Content] | None:
    judged = {rel: judge_file(rel.rsplit("/", 1)[-1], p) for rel, p in files.items() if p.read and (with_json or not rel.endswith(".json"))}
    return next(((rel, c) for rel, c in sorted(judged.items()) if c.state == "cut"), None)


def _dcp(top: dict[str, Probe], cut: tuple[str, Content] | None) -> Content:
    shards = sorted(rel for rel in top if DCP_FILE.match(rel))
    if cut:
        return Content(state="cut", format=DCP, detail=f"cut short: its {cut[0]} is ({cut[1].detail})")
    if ".metadata" not in top or top[".metadata"].size == 0:
        return Content(state="cut", format=DCP, detail=f"cut short: {len(shards)} __N_M.distcp file(s) and no .metadata (written last)")
    if not shards:
        return Content(state="cut", format=DCP, detail="cut short: .metadata without any __N_M.distcp file")
    return Content(state="complete", format=DCP, detail=f"complete: .metadata and {len(shards)} __N_M.distcp file(s)")


def _hugging_face(probe: EntryProbe, top: dict[str, Probe], cut: tuple[str, Content] | None) -> Content:
    files = probe.files
    if cut:
        return Content(state="cut", format=HF, detail=f"cut short: its {cut[0]} is ({cut[1].detail})")
    parsed = parses(top["trainer_state.json"])
    if parsed is None:
        return Content(state="unknown", format=HF, detail="its trainer_state.json was not read (too large)")
    if not parsed:
        return Content(state="cut", format=HF, detail="cut short: its trainer_state.json does not parse")
    named = 0
    for rel in sorted(r for r in top if r.endswith(".index.json")):
        ok = parses(top[rel])
        if not ok:
            state = "unknown" if ok is None else "cut"
            return Content(state=state, format=HF, detail=f"its {rel} {'was not read' if ok is None else 'does not parse'}")
        weight_map = json.loads(top[rel].head.decode()).get("weight_map", {})
        for shard in sorted(set(weight_map.values()) if isinstance(weight_map, dict) else ()):
            named += 1
            if str(shard) not in files or files[str(shard)].size == 0:
                if probe.crowded and str(shard) not in files:
                    return Content(state="unknown", format=HF, detail=f"{shard} (named by {rel}) not among the files listed")
                missing = "missing" if str(shard) not in files else "empty"
                return Content(state="cut", format=HF, detail=f"cut short: {shard}, named by {rel}, is {missing}")
    whole = sum(1 for rel, p in files.items() if p.read and not rel.endswith(".json") and judge_file(rel, p).state == "complete")
    return Content(
        state="complete",
        format=HF,
        detail=f"complete: trainer_state.json parses, the {named} file(s) its index names are there, {whole} file(s) whole by their format",
    )


def _shape(rel: str) -> str:
    """A file's path with its numbers as `#`: `model_300.pt` in step_300 is `model_300.pt`'s counterpart in step_200."""
    return re.sub(r"\d+", "#", rel)


def _by_previous(probe: EntryProbe, unproven: list[str], previous: tuple[str, EntryProbe]) -> Content | None:
    """A folder against the series' previous save: every file it held is here, and a file whose format cannot say
    whether it is whole has the size it had there. None where that proves it complete."""
    name, before = previous
    mine, theirs = Counter(map(_shape, probe.files)), Counter(map(_shape, before.files))
    if missing := theirs - mine:
        lacks = sorted(rel for rel in before.files if _shape(rel) in missing)[0]
        return Content(
            state="cut",
            format="folder",
            detail=f"cut short: it lacks {lacks}, which {name} holds (another save of its series; {sum(missing.values())} file(s) fewer)",
        )
    sizes = {_shape(rel): p.size for rel, p in before.files.items() if theirs[_shape(rel)] == 1}
    for rel in unproven:
        size, was = probe.files[rel].size, sizes.get(_shape(rel))
        if was is not None and size < was:
            return Content(state="cut", format="folder", detail=f"cut short: its {rel} is {size} bytes where {name}'s was {was}")
        if was != size:
            return Content(state="unknown", format=UNKNOWN, detail=f"its {rel} is of no format relaunch reads, and not of {name}'s size")
    return None


def _no_layout(probe: EntryProbe, previous: tuple[str, EntryProbe] | None) -> Content:
    """A folder of no known layout: every file whole by its format (or by the size it had in the series' previous
    save) and every file that save held. Its timing says nothing: a folder renamed in whole just before a SIGKILL is
    complete, one whose last file was never begun is not, whatever was written after it."""
    judged = {rel: judge_file(rel.rsplit("/", 1)[-1], p) for rel, p in probe.files.items()}
    formats = ", ".join(sorted({c.format for c in judged.values() if c.state == "complete"})) or "none"
    unproven = sorted(rel for rel, c in judged.items() if c.state != "complete")
    if probe.crowded:
        return Content(state="unknown", format=UNKNOWN, detail="a folder of no known layout holding more files than were listed")
    if previous is None or not previous[1].files:
        if unproven or not judged:
            return Content(
                state="unknown",
                format=UNKNOWN,
                detail="a folder of no layout relaunch can read (DCP or Hugging Face Trainer), no earlier save of its series to compare with",
            )
        detail = f"complete: its {len(judged)} file(s) whole by their format ({formats}); no earlier save of its series to compare its files with"
        return Content(state="complete", format="folder", detail=detail)
    if (against := _by_previous(probe, unproven, previous)) is not None:
        return against
    return Content(
        state="complete",
        format="folder",
        detail=f"complete: {len(judged)} file(s), whole by their format ({formats}) or of the size they had in {previous[0]}, and every file "
        f"{previous[0]} holds",
    )


def judge_folder(probe: EntryProbe, previous: tuple[str, EntryProbe] | None = None) -> Content:
    """A folder by its layout: DCP, a Hugging Face Trainer save, else by its files and the series' `previous` save
    (its name and what was read of it); in any folder, a file of a known format that is cut makes it cut."""
    top = {rel: p for rel, p in probe.files.items() if "/" not in rel}
    if ".metadata" in top or any(DCP_FILE.match(rel) for rel in top):
        return _dcp(top, _first_cut(probe.files, with_json=False))
    if "trainer_state.json" in top:
        return _hugging_face(probe, top, _first_cut(probe.files, with_json=False))
    if cut := _first_cut(probe.files, with_json=True):
        return Content(state="cut", format=f"folder of {cut[1].format} files", detail=f"cut short: its {cut[0]} is ({cut[1].detail})")
    return _no_layout(probe, previous)


def judge(entry: Entry, probe: EntryProbe | None, previous: tuple[str, EntryProbe] | None = None) -> Content | None:
    """An entry by its content, or None where the host read none of it (not among the newest)."""
    if probe is None or not probe.files:
        return None
    if entry.kind == "f" or (entry.kind == "l" and "" in probe.files):
        return judge_file(entry.name, probe.files[""]) if "" in probe.files else None
    return judge_folder(probe, previous)


def judge_all(entries: list[Entry], probes: dict[str, EntryProbe]) -> dict[str, Content]:
    """Each entry read, by its content; a folder beside the series' previous save: the one written before it (in
    time, not by its number: a second stage counting from 0 again, a rollback), read and not cut. A trainer writes one
    save at a time: the one before a save it began was finished."""
    content: dict[str, Content] = {}
    previous: dict[str, tuple[str, EntryProbe]] = {}
    for e in sorted(entries, key=lambda e: (e.written, e.name)):
        probe = probes.get(e.name)
        key = series_key(series_of(e.name) or "") if order_of(e.name) is not None and e.kind == "d" else None
        c = judge(e, probe, previous.get(key) if key is not None else None)
        if c is not None:
            content[e.name] = c
        if key is not None and probe is not None and probe.files and (c is None or c.state != "cut"):
            previous[key] = (e.name, probe)
    return content
