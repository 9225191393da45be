"""A file judged by its content: what the bytes the host read of it say. A torch.save zip by its end records, a
safetensors file by its header's length, a .npy array by its header, a pickle by its STOP opcode, JSON by parsing;
anything else is `unknown` (judged by time, relaunch/deciding/checkpoint_deaths.py, or inside a folder by the sizes of
the series' previous save, checkpoint_folders.py). No I/O: the host only gathers bytes (relaunch/host/list_checkpoints.sh).
"""

from __future__ import annotations

import ast
import json
import math
import re
import struct
from typing import Literal

from pydantic import BaseModel

from relaunch.plans.checkpoint_listing import Probe


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
UNKNOWN = "format unknown"
NPY, NPY_MAGIC = "numpy .npy", b"\x93NUMPY"
PICKLE, PICKLE_NAME = "pickle", re.compile(r"\.(pkl|pickle)$", re.IGNORECASE)
# torch.save's legacy format starts with a pickled magic number, then more pickles and raw storage bytes: no STOP ends it.
TORCH_LEGACY = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."
# A numpy dtype string: its kind and its size in bytes (in characters for `U`, 4 bytes each).
NPY_DTYPE = re.compile(r"^[<>|=]?([bBiufcmMSUV])(\d+)(\[\w+\])?$")


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


def _npy(p: Probe) -> Content:
    """`\\x93NUMPY`, a version, the header's length (2 bytes in version 1, 4 after), a dict literal header (`descr`,
    `shape`), then the data: header and data end where the file does."""
    h = p.head
    if len(h) >= 6 and not h.startswith(NPY_MAGIC):
        return Content(state="unknown", format=UNKNOWN, detail="named .npy, without the .npy magic")
    start, width = (10, "<H") if len(h) > 6 and h[6] == 1 else (12, "<I")
    if p.size < start:
        return Content(state="cut", format=NPY, detail=f"cut short: {p.size} bytes, fewer than its header's length")
    if len(h) < start or h[6] not in (1, 2, 3):
        return Content(state="unknown", format=NPY, detail="its header's length was not read, or its version is unknown")
    (n,) = struct.unpack_from(width, h, 8)
    if start + n > p.size:
        return Content(state="cut", format=NPY, detail=f"cut short: its {n}-byte header runs past its {p.size} bytes")
    if len(h) < start + n:
        return Content(state="unknown", format=NPY, detail=f"its {n}-byte header was not read (too large)")
    try:
        header = ast.literal_eval(h[start : start + n].decode("latin-1").strip())
        dtype, shape = NPY_DTYPE.match(str(header["descr"])), tuple(int(d) for d in header["shape"])
    except (ValueError, SyntaxError, TypeError, KeyError, MemoryError, RecursionError):
        return Content(state="cut", format=NPY, detail="damaged: its header does not parse as a .npy header")
    if dtype is None:
        return Content(state="unknown", format=NPY, detail=f"its dtype {header['descr']!r} is not one of fixed size")
    item = int(dtype[2]) * (4 if dtype[1] == "U" else 1)
    want = start + n + math.prod(shape) * item
    if want != p.size:
        how = "cut short" if want > p.size else "damaged"
        return Content(state="cut", format=NPY, detail=f"{how}: {p.size} bytes where its header describes {want}")
    return Content(state="complete", format=NPY, detail=f"complete: shape {shape}, the file ends where its header says")


def _pickle(p: Probe) -> Content:
    """A pickle of protocol 2 or later starts with PROTO (0x80) and ends with STOP (`.`); from protocol 4 on, its first
    frame's length is in its first bytes. (A pickle of protocol 2 or 3 cut right after a byte 0x2e reads as whole.)"""
    if p.size == 0:
        return Content(state="cut", format=PICKLE, detail="cut short: empty")
    if p.head.startswith(TORCH_LEGACY):
        return Content(state="unknown", format=UNKNOWN, detail="torch.save's legacy format (pickles and raw data)")
    if not p.head.startswith(b"\x80"):
        return Content(state="unknown", format=UNKNOWN, detail="no pickle of protocol 2 or later")
    if p.head[1:2] in (b"\x04", b"\x05") and p.head[2:3] == b"\x95" and len(p.head) >= 11:
        (frame,) = struct.unpack_from("<Q", p.head, 3)  # protocol 4 and 5 frame their opcodes: the first frame's length
        if p.size < 11 + frame:
            return Content(state="cut", format=PICKLE, detail=f"cut short: its first frame of {frame} bytes runs past its {p.size} bytes")
    if not p.tail.endswith(b"."):
        return Content(state="cut", format=PICKLE, detail=f"cut short: its {p.size} bytes do not end with pickle's STOP opcode")
    return Content(state="complete", format=PICKLE, detail="complete: it ends with pickle's STOP opcode")


def parses(p: Probe) -> bool | None:
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


def _json(p: Probe) -> Content:
    parsed = parses(p)
    if parsed is None:
        return Content(state="unknown", format="JSON", detail="not read whole (too large)")
    if not parsed:
        return Content(state="cut", format="JSON", detail="cut short: it does not parse")
    return Content(state="complete", format="JSON", detail="complete: it parses")


def judge_file(name: str, p: Probe) -> Content:
    """A file by its own bytes: safetensors, .npy, a pickle and JSON by its name, a zip by its first bytes; anything
    else is unknown."""
    if not p.read:
        return Content(state="unknown", format=UNKNOWN, detail="its bytes were not read")
    if name.endswith(".safetensors"):
        return _safetensors(p)
    if name.endswith(".json"):
        return _json(p)
    if name.endswith(".npy"):
        return _npy(p)
    if p.head.startswith(ZIP_MAGIC):
        return _zip(p)
    if p.head and p.size < 22 and ZIP_MAGIC.startswith(p.head[:4]):
        return Content(state="cut", format=TORCH, detail=f"cut short: {p.size} bytes of a zip's start, smaller than any whole zip")
    if PICKLE_NAME.search(name):
        return _pickle(p)
    return Content(state="unknown", format=UNKNOWN, detail="neither a zip (torch.save) nor safetensors")
