"""Checkpoints judged by their content: what the bytes the host read of an entry say of it. A torch.save zip, a
safetensors file, a DCP folder, a Hugging Face Trainer folder; anything else is `unknown`, judged by time
(relaunch/deciding/checkpoint_deaths.py). No I/O: the host only gathers bytes (relaunch/host/list_checkpoints.sh).
"""

from __future__ import annotations

import json
import re
import struct
from typing import Literal

from pydantic import BaseModel

from relaunch.plans.checkpoint_listing import Entry, EntryProbe, Probe


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
