"""What torchrun and NCCL say about which rank failed first. Pure parsing of their real output.

torchrun's ChildFailedError is only a wrapper; its "Root Cause (first observed failure)" block names the
rank that failed first, with its exit code or signal. NCCL's watchdog names the rank and the collective.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

ROOT_CAUSE = "Root Cause (first observed failure):"
FIELD = re.compile(r"^\s+(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s*(?P<value>.*)$")
RANK = re.compile(r"(?P<rank>\d+)(?: \(local_rank: (?P<local>\d+)\))?")
EXITCODE = re.compile(r"(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?")
WATCHDOG = re.compile(
    r"\[Rank (?P<rank>\d+)\] Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)[^)]*Timeout\(ms\)=(?P<timeout>\d+)\) ran for (?P<ran>\d+) milliseconds"
)


@dataclass(frozen=True)
class RankFailure:
    rank: int
    local_rank: int | None
    exitcode: int
    pid: int | None
    host: str

    @property
    def signal_number(self) -> int | None:
        return -self.exitcode if self.exitcode < 0 else None

    def describe(self) -> str:
        where = (
            f"rank {self.rank}"
            + (f" (local_rank {self.local_rank}" if self.local_rank is not None else " (")
            + (f", pid {self.pid}" if self.pid else "")
            + f", host {self.host})"
        )
        if self.signal_number:
            return f"{where} died of {_signal_name(self.signal_number)}: the first rank to fail (torchrun's root cause)"
        return f"{where} exited {self.exitcode}: the first rank to fail (torchrun's root cause)"


def root_cause(lines: list[str]) -> RankFailure | None:
    """The rank torchrun names as the first observed failure, or None where there is no such block."""
    start = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].strip() == ROOT_CAUSE), None)
    if start is None:
        return None
    fields: dict[str, str] = {}
    for line in lines[start + 1 : start + 12]:
        m = FIELD.match(line)
        if m:
            fields[m["key"]] = m["value"].strip()
    rank, code = RANK.match(fields.get("rank", "")), EXITCODE.match(fields.get("exitcode", ""))
    if not rank or not code:
        return None
    local = int(rank["local"]) if rank["local"] else None
    return RankFailure(
        rank=int(rank["rank"]),
        local_rank=local,
        exitcode=int(code["code"]),
        pid=int(code["pid"]) if code["pid"] else None,
        host=fields.get("host", "?"),
    )


def collective_timeouts(lines: list[str]) -> list[str]:
    """One line per rank whose NCCL watchdog timed out: which collective, which sequence number, how long."""
    seen: dict[str, str] = {}
    for line in lines:
        m = WATCHDOG.search(line)
        if m and m["rank"] not in seen:
            seen[m["rank"]] = f"rank {m['rank']}: {m['op']} (SeqNum {m['seq']}) ran {m['ran']} ms, past its {m['timeout']} ms timeout"
    return list(seen.values())


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
