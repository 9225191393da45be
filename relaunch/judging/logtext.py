"""Log text as relaunch reads it: colour codes stripped, `\\r` redraws split, lines capped; one bounded reader.

The host-side poll and `relaunch diagnose` must judge the same lines, so both go through clean_lines,
and read_log quotes what the host's `grep -a -B 12 -m 30 -E FAILURE_WORDS` and `tail` quote.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from relaunch.errors import ConfigError
from relaunch.judging.signatures import CLAUSE_BREAK, GOVERNS_AFTER, NOT_A_TRAINING_STEP, PATH_TOKEN

MAX_LINE_CHARS = 2000

# Words that make a line look like a failure. The single definition: the host poll's `grep -E`
# (relaunch/host/snapshot.sh) must look for exactly these, or the poll and diagnose disagree.
FAILURE_WORD_LIST: tuple[str, ...] = (
    "Error",
    "Exception",
    "Traceback",
    "Killed",
    "NCCL",
    "out of memory",
    "pip install",
    "without torch.compile",
)
FAILURE_WORDS = "|".join(FAILURE_WORD_LIST)  # as grep -E reads it (its `.` matches any byte; the scan wants a `.`)
FAILURE_RE = re.compile(FAILURE_WORDS)
_WORDS = tuple(word.encode() for word in FAILURE_WORD_LIST)

# CSI (`\x1b[31m`, `\x1b[2K`, `\x1b[1A`), OSC (`\x1b]...\x07` or `\x1b]...\x1b\\`), then any other escape
# (`\x1b7`, `\x1b(B`); a lone or cut-off ESC goes too.
ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\n]*(?:\x07|\x1b\\)?|[ -/]*[0-~])?")

_CHUNK = 8 << 20  # forward scan reads; bounded memory whatever the file or its lines
_OVERLAP = max(map(len, FAILURE_WORD_LIST)) - 1  # a word cut by a chunk boundary is found in the next
_BACK_BLOCK = 256 << 10  # backward reads when looking for the lines before a match
_CONTEXT_REACH = 1 << 20  # context stops at a line longer than this: a dump, not evidence, and slow to walk back
_WINDOW = MAX_LINE_CHARS * 4 + 512  # bytes read of one quoted line: 2000 UTF-8 chars plus colour codes


@dataclass(frozen=True)
class LogExcerpt:
    """What diagnosis needs of a log of any size; every line already went through clean_lines."""

    matches: list[str] = field(default_factory=list)  # earliest failure lines with context, before the tail
    tail: list[str] = field(default_factory=list)
    size_bytes: int = 0
    mtime: float = 0.0


def clean_lines(text: str) -> list[str]:
    """Lines as a person saw them on a terminal: no colour codes, each `\\r` redraw its own line, capped."""
    lines = _strip(text).split("\n")
    if lines[-1] == "":  # text ended with a newline: no line after it
        lines.pop()
    if "\r" in text:
        lines = [seg for line in lines for seg in _redraws(line)]
    return [_cap(line) for line in lines]


def read_log(
    path: str | os.PathLike[str],
    *,
    tail_bytes: int = 1 << 20,
    tail_lines: int = 400,
    max_matches: int = 30,
    context_lines: int = 12,
) -> LogExcerpt:
    """The log's earliest failure lines and its tail, in bounded memory and time whatever its size."""
    _require_regular_file(path, os.stat(path))  # before open: opening a FIFO blocks until a writer comes
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        _require_regular_file(path, st)  # it may have been swapped since the stat
        tail, tail_at = _tail(fd, st.st_size, tail_bytes, tail_lines)
        matches = _Scan(fd, context_lines).run(tail_at, max_matches, tail) if max_matches > 0 else []
    finally:
        os.close(fd)
    return LogExcerpt(matches=matches, tail=tail, size_bytes=st.st_size, mtime=st.st_mtime)


# ---- text ------------------------------------------------------------------------------------


def _strip(text: str) -> str:
    if "\x1b" in text:
        text = ANSI.sub("", text)
    if "\x00" in text:  # a log truncated under a writer (copytruncate) starts with a run of NULs
        text = text.replace("\x00", "")
    return text.replace("\r\n", "\n") if "\r" in text else text


def _redraws(line: str) -> list[str]:
    """A bare `\\r` starts a redraw; what it leaves empty is no line."""
    return [seg for seg in line.split("\r") if seg] if "\r" in line else [line]


def _cap(line: str, unread: int = 0) -> str:
    """The line's start, and how much more there was (`~` where part of it was never read)."""
    if len(line) <= MAX_LINE_CHARS and not unread:
        return line
    more = len(line) - min(len(line), MAX_LINE_CHARS) + unread
    return f"{line[:MAX_LINE_CHARS]} … [{'~' if unread else ''}{more} more chars]"


# ---- numbers and step mentions as people print them ----------------------------------------------------------

# A number as printed, separators and all: `21300`, `21,300`, `21_300`, `21'300`, `21 300` (thin or no-break spaces),
# `2.13e+04`, `21.3`; also what it must not be read as (`21.300`, `21,3`, `21.300,5`), to be told apart below.
NUMBER = r"\d(?:[\d,_'\u2009\u202f\u00a0.]*\d)?(?:[eE][-+]?\d+)?"
_PLAIN = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_GROUPED = re.compile(r"\d{1,3}(?P<sep>[,_'\u2009\u202f\u00a0])\d{3}(?:(?P=sep)\d{3})*(?:\.\d+)?")
# `21.300`: 21.3 printed to three places, or European thousands? Either; so neither.
_DOT_OR_THOUSANDS = re.compile(r"[1-9]\d{0,2}\.\d{3}")
SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6}


def printed_number(text: str, suffix: str = "") -> float | None:
    """The value of a number as people print it (`21,300`, `21_300`, `21'300`, `2.13e+04`, `21.3` with suffix `k`),
    or None where it is not certain: a separator that may be a decimal mark (`21,3`, `21.300`, `21.300,5`), groups
    that are not thousands (`2,13,000`), a separator beside an exponent."""
    scale = SUFFIX.get(suffix.lower())
    if scale is None:
        return None
    if _PLAIN.fullmatch(text):
        if not suffix and _DOT_OR_THOUSANDS.fullmatch(text):
            return None
        return float(text) * scale
    grouped = _GROUPED.fullmatch(text)
    if grouped:
        return float(text.replace(grouped["sep"], "")) * scale
    return None


def training_step_mention(line: str, start: int, end: int) -> bool:
    """Whether the step mention line[start:end] reports a training step (verdicts.NOT_A_TRAINING_STEP's rule): not
    inside a path or file name, and not governed by a resume, load, save or eval word in its clause (before it, or
    after it one of GOVERNS_AFTER)."""
    token_start = max(line.rfind(" ", 0, start), line.rfind("\t", 0, start)) + 1
    token_end = next((i for i in range(start, len(line)) if line[i] in " \t"), len(line))
    if PATH_TOKEN.search(line[token_start:token_end].strip("'\"`()[]<>,")):
        return False
    clause_start = max((m.end() for m in CLAUSE_BREAK.finditer(line, 0, start)), default=0)
    after = CLAUSE_BREAK.search(line, end)
    clause_end = after.start() if after else len(line)
    if NOT_A_TRAINING_STEP.search(line, clause_start, end):
        return False
    return not any(GOVERNS_AFTER.match(m.group(0)) for m in NOT_A_TRAINING_STEP.finditer(line, end, clause_end))


# ---- the file ----------------------------------------------------------------------------------

_NOT_A_LOG = (
    (stat.S_ISDIR, "a directory", "give the path of the log file inside it"),
    (
        stat.S_ISFIFO,
        "a FIFO (named pipe)",
        "reading one blocks until something writes to it and then sees only new output; save the trainer's output to a file (`... | tee trainer.log`) and give that file",
    ),
    (stat.S_ISCHR, "a character device", "a device like /dev/zero never ends; give the path of the trainer's saved log file"),
    (stat.S_ISBLK, "a block device", "give the path of the trainer's saved log file"),
    (stat.S_ISSOCK, "a socket", "give the path of the trainer's saved log file"),
)


def _require_regular_file(path: str | os.PathLike[str], st: os.stat_result) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    kind, advice = next(
        ((k, a) for test, k, a in _NOT_A_LOG if test(st.st_mode)), ("not a regular file", "give the path of the trainer's saved log file")
    )
    raise ConfigError(f"{os.fspath(path)} is {kind}, not a log file: {advice}")


def _tail(fd: int, size: int, tail_bytes: int, tail_lines: int) -> tuple[list[str], int]:
    """The last cleaned lines of the last tail_bytes, and the offset of the line the first one is on."""
    start = max(0, size - tail_bytes)
    lead = 1 if start else 0  # the byte before tells whether the tail starts a line
    data = os.pread(fd, size - start + lead, start - lead)
    if lead:
        cut = _end_of_first_line(data)
        if cut < 0:  # all of it is the end of the file's last line: quote that line from its start, as tail | cut
            line_start = _line_start(fd, start)
            quoted = _quote(fd, line_start, start - lead + len(data.rstrip(b"\r\n")))
            return [quoted][:tail_lines] if quoted is not None else [], line_start
        data, start = data[cut + 1 :], start - lead + cut + 1
    lines, at = _last_lines(data, tail_lines)
    return lines, start + at


def _end_of_first_line(data: bytes) -> int:
    """Where the partial first line ends; -1 when no other line follows it."""
    stop = len(data.rstrip(b"\r\n"))
    cut = data.find(b"\n", 0, stop)
    return cut if cut >= 0 else data.find(b"\r", 0, stop)  # a progress bar that never ends its line


def _line_start(fd: int, offset: int) -> int:
    return next((at + 1 for at, _ in _breaks_before(fd, offset, offset)), 0)


def _last_lines(data: bytes, n: int) -> tuple[list[str], int]:
    """The last n cleaned lines of data, and where in data the raw line of the first of them starts."""
    out: list[str] = []
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    start = len(data)
    while len(out) < n and start > 0:
        start = data.rfind(b"\n", 0, end) + 1
        # Cleaned one raw line at a time, with its newline: the same lines clean_lines gives for all of it.
        out[:0] = clean_lines(data[start:end].decode("utf-8", "replace") + "\n")
        end = start - 1
    return out[-n:] if n else [], start


def _first_break(data: bytes | bytearray, lo: int, hi: int) -> int:
    lf = data.find(b"\n", lo, hi)
    cr = data.find(b"\r", lo, lf if lf >= 0 else hi)  # no second scan past the newline
    return cr if cr >= 0 else lf


def _breaks_before(fd: int, offset: int, reach: int) -> Iterator[tuple[int, int]]:
    """(offset, byte) of each `\\n` or `\\r` before offset, nearest first, at most reach bytes back."""
    floor, hi = max(0, offset - reach), offset
    while hi > floor:
        lo = max(floor, hi - _BACK_BLOCK)
        block = os.pread(fd, hi - lo, lo)
        lf, cr = block.rfind(b"\n"), block.rfind(b"\r")
        while lf >= 0 or cr >= 0:  # each byte searched for once: no rescans of a long line
            if lf > cr:
                yield lo + lf, 10
                lf = block.rfind(b"\n", 0, lf)
            else:
                yield lo + cr, 13
                cr = block.rfind(b"\r", 0, cr)
        hi = lo


class _Scan:
    """`grep -a -B CONTEXT -m MAX` over the bytes before the tail, `\\r` and `\\n` both ending a line."""

    def __init__(self, fd: int, context_lines: int) -> None:
        self.fd, self.context_lines = fd, context_lines
        self.spans: dict[int, int] = {}  # start -> end (offset of the break) of every line to quote
        self.found = 0
        self.resume = 0  # one hit per line: hits before this offset are in a line already quoted
        self.open_line: int | None = None  # a hit's line whose end is past the bytes read so far

    def run(self, end: int, max_matches: int, tail: list[str]) -> list[str]:
        self._forward(end, max_matches)
        if self.open_line is not None:
            self.spans[self.open_line] = end
        if self.found < max_matches:
            self._context_of_early_tail_hits(end, tail)
        quoted = (_quote(self.fd, start, stop) for start, stop in sorted(self.spans.items()))
        return [line for line in quoted if line is not None]

    def _forward(self, end: int, max_matches: int) -> None:
        buf = bytearray(_OVERLAP + _CHUNK)
        view = memoryview(buf)
        offset = 0
        while offset < end and (self.found < max_matches or self.open_line is not None):
            got = os.preadv(self.fd, [view[_OVERLAP : _OVERLAP + min(_CHUNK, end - offset)]], offset)
            if got <= 0:
                break
            self._chunk(buf, offset - _OVERLAP, _OVERLAP + got, max_matches)
            buf[:_OVERLAP] = buf[got : _OVERLAP + got]  # the last bytes read, for a word cut in two
            offset += got

    def _chunk(self, buf: bytearray, base: int, hi: int, max_matches: int) -> None:
        i = max(0, self.resume - base)
        if self.open_line is not None:  # the last hit's line runs into this chunk: find its end first
            brk = _first_break(buf, _OVERLAP, hi)
            if brk < 0:
                return
            self._close(self.open_line, base + brk)
            i = brk + 1
        nexts: dict[bytes, int] = {}
        while self.found < max_matches:
            hit = _next_hit(buf, i, hi, nexts)
            if hit < 0:
                return
            start = self._add_hit(base + hit)
            brk = _first_break(buf, hit, hi)
            if brk < 0:
                self.open_line, self.resume = start, 1 << 62
                return
            self._close(start, base + brk)
            i = brk + 1

    def _close(self, start: int, brk: int) -> None:
        self.spans[start] = brk
        self.open_line, self.resume = None, brk + 1

    def _add_hit(self, hit: int) -> int:
        """Record the line holding offset hit and the lines before it; return the line's start."""
        start = _line_start(self.fd, hit)
        for line_start, line_end in self._lines_before(start, self.context_lines):
            self.spans.setdefault(line_start, line_end)
        self.found += 1
        return start

    def _lines_before(self, start: int, count: int) -> list[tuple[int, int]]:
        """(start, end) of up to count lines ending just before start, oldest first, counted as grep -B does."""
        lines: list[tuple[int, int]] = []
        if start == 0 or count <= 0:
            return lines
        seg_end = start - 1
        newline = can_merge = os.pread(self.fd, 1, seg_end) == b"\n"
        floor = max(0, seg_end - _CONTEXT_REACH)
        for at, byte in _breaks_before(self.fd, seg_end, seg_end - floor):
            if can_merge and byte == 13 and at + 1 == seg_end:
                seg_end, can_merge = at, False  # `\r\n` is one line break
                continue
            # An empty line is a line only between two newlines; a bare `\r` leaves none (see clean_lines).
            if at + 1 < seg_end or (newline and byte == 10):
                lines.append((at + 1, seg_end))
                if len(lines) == count:
                    return lines[::-1]
            seg_end, newline, can_merge = at, byte == 10, byte == 10
        if floor == 0 and (seg_end > 0 or newline):  # the file's first line
            lines.append((0, seg_end))
        return lines[::-1]

    def _context_of_early_tail_hits(self, tail_at: int, tail: list[str]) -> None:
        """A hit in the tail's first lines brings lines before the tail, as the host's grep -B does."""
        for index, line in enumerate(tail[: self.context_lines]):
            if FAILURE_RE.search(line):
                for line_start, line_end in self._lines_before(tail_at, self.context_lines - index):
                    self.spans.setdefault(line_start, line_end)
                return


def _quote(fd: int, start: int, end: int) -> str | None:
    """One line of the file, cleaned and capped, from at most _WINDOW bytes of it."""
    raw = os.pread(fd, min(end - start, _WINDOW), start)
    text = _strip(raw.decode("utf-8", "replace"))
    if not text and end > start:  # only colour codes: nothing a person would have seen
        return None
    return _cap(text, unread=end - start - len(raw))


def _next_hit(buf: bytearray, i: int, hi: int, nexts: dict[bytes, int]) -> int:
    """The first failure word at or after i: bytes.find per word is several times faster than one regex."""
    best = -1
    for word in _WORDS:
        at = nexts.get(word)
        if at is None or 0 <= at < i:  # -1 stays valid: the word is not in the rest of this chunk
            at = nexts[word] = buf.find(word, i, hi)
        if at >= 0 and (best < 0 or at < best):
            best = at
    return best


N = TypeVar("N", int, float)


def number_or_none(text: str | None, kind: Callable[[str], N]) -> N | None:
    """A host file's number (`kind` of it), or None where the file was empty, missing or half-written."""
    try:
        return kind(text) if text else None
    except ValueError:
        return None
