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

    def describe(self, role: str = "the first rank to fail (torchrun's root cause)") -> str:
        where = (
            f"rank {self.rank}"
            + (f" (local_rank {self.local_rank}" if self.local_rank is not None else " (")
            + (f", pid {self.pid}" if self.pid else "")
            + f", host {self.host})"
        )
        if self.signal_number:
            return f"{where} died of {_signal_name(self.signal_number)}: {role}"
        return f"{where} exited {self.exitcode}: {role}"


def root_cause(lines: list[str]) -> RankFailure | None:
    """The rank torchrun names as the first observed failure, or None where there is no such block."""
    start = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].strip() == ROOT_CAUSE), None)
    if start is None:
        return None
    return _entry(lines[start + 1 : start + 12])


def failed_ranks(lines: list[str]) -> list[RankFailure]:
    """Every rank torchrun's ChildFailedError lists (its `Failures:` and its root cause), in the order it prints them.

    torchrun's "first observed failure" is the first worker it saw exit: a rank that lost its peer and raised may be
    seen before the peer that died of a signal (cpu/rank_segv_torchrun.log), so the root cause is one failure among these."""
    end = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].strip() == ROOT_CAUSE), None)
    if end is None:
        return []
    start = next((i for i in range(end, max(-1, end - 200), -1) if lines[i].strip() == "Failures:"), end)
    blocks: list[list[str]] = []
    for line in lines[start : end + 12]:
        if ENTRY.match(line):
            blocks.append([])
        elif blocks:
            blocks[-1].append(line)
    return [failure for block in blocks if (failure := _entry(block[:8])) is not None]


ENTRY = re.compile(r"^\s*\[\d+\]:\s*$")


def _entry(block: list[str]) -> RankFailure | None:
    """One `[k]:` entry of torchrun's failure table: its rank and how it ended."""
    fields: dict[str, str] = {}
    for line in block:
        m = FIELD.match(line)
        if m:
            fields.setdefault(m["key"], m["value"].strip())
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


# torch prefixes what a rank's Python prints about its failure with its global rank (`[rank1]: Traceback ...`, its
# glog lines `[rank0]:[E1129 ...`): one log of several ranks says whose each line is.
RANK_PREFIX = re.compile(r"^\[rank(?P<rank>\d+)\]:\s?")


def rank_lines(lines: list[str]) -> dict[int, list[tuple[int, str]]]:
    """Each rank's own lines, in log order, with their index in `lines` and the `[rankN]:` prefix removed."""
    out: dict[int, list[tuple[int, str]]] = {}
    for index, line in enumerate(lines):
        if m := RANK_PREFIX.match(line):
            out.setdefault(int(m["rank"]), []).append((index, line[m.end() :]))
    return out


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


# A rendezvous that never completed, in each face torch prints (fixtures cpu/rendezvous_timeout_*.log,
# cpu/tcpstore_*.log): rank 0's TCPStore counting who joined, a rank that could not reach rank 0's store,
# and torchrun's c10d rendezvous running past its join_timeout (it names no one).
STORE_JOINED = re.compile(r"Timed out after (?P<s>\d+) seconds waiting for clients\. (?P<joined>\d+)/(?P<size>\d+) clients joined")
STORE_UNREACHED = re.compile(
    r"client socket has timed out after (?P<ms>\d+)ms while trying to connect to \((?P<host>[^,]+), (?P<port>\d+)\)"
)
C10D_TIMEOUT = re.compile(r"\bRendezvousTimeoutError\b")


def rendezvous_gap(lines: list[str]) -> str | None:
    """Who never joined, as far as the text says; None where the lines show no rendezvous that failed to complete.

    torchrun's static rendezvous counts nodes (one store client per node's agent, its frames in static_tcp_rendezvous.py);
    init_process_group's store counts ranks."""
    nodes = any("static_tcp_rendezvous" in line for line in lines)
    for line in lines:
        if m := STORE_JOINED.search(line):
            joined, size = int(m["joined"]), int(m["size"])
            who = "nodes (torchrun's agents)" if nodes else "ranks"
            return (
                f"the rendezvous never completed: {joined} of {size} {who} joined rank 0's store in {m['s']} s; "
                f"{size - joined} never did: start or repair the missing {'node' if nodes else 'rank'}"
            )
        if m := STORE_UNREACHED.search(line):
            return (
                f"the rendezvous never completed: rank 0's store at {m['host']}:{m['port']} (MASTER_ADDR) did not answer "
                f"within {int(m['ms']) / 1000:.0f} s: the node with rank 0 is down or was never started"
            )
        if C10D_TIMEOUT.search(line):
            return "the rendezvous never completed: torchrun's c10d rendezvous ran past its join_timeout with fewer nodes than --nnodes"
    return None


# torchrun's agent, each time a worker of its group fails (`E1202 ... api.py:1002] failed (exitcode: -9) local_rank: 1
# (pid: 30778) of binary: ...`). More than one such failure in one log: the agent restarted the group (--max-restarts)
# and it failed again (cpu/torchrun_restarts_exhausted.log); torch prints the restart itself only at INFO level.
WORKER_FAILED = re.compile(r"\] failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\) of binary")


def worker_group_failures(lines: list[str]) -> list[str]:
    """One line per failure of torchrun's worker group, in order: which local rank, its pid, how it ended."""
    failures: list[str] = []
    for line in lines:
        if m := WORKER_FAILED.search(line):
            code = int(m["code"])
            how = f"died of {_signal_name(-code)}" if code < 0 else f"exited {code}"
            failures.append(f"worker group failure {len(failures) + 1}: local_rank {m['local']} (pid {m['pid']}) {how}")
    return failures


# Rank 0's report of a dist.monitored_barrier that timed out (cpu/monitored_barrier_*.log): glog's `[Rank 0]: Rank 1 failed
# to pass monitoredBarrier in 30000 ms`, one line per late rank with wait_all_ranks=True and then `Ranks 1, 2 failed ...`.
BARRIER_TIMEOUT = re.compile(
    r"(?:\[Rank (?P<by>\d+)\]: )?Ranks? (?P<ranks>\d+(?:, \d+)*) failed to pass monitoredBarrier in (?P<ms>\d+) ms"
)


def barrier_absentees(lines: list[str]) -> str | None:
    """Which ranks never reached a monitored barrier, and who waited how long for them; None where no barrier timed out.

    monitored_barrier is checked by rank 0 alone: the ranks it names are the failure (stuck, slow or dead before the
    barrier), rank 0's error and torchrun's root cause only report it."""
    absent: list[int] = []
    by, waited = "0", ""
    for line in lines:
        if m := BARRIER_TIMEOUT.search(line):
            absent += [r for r in map(int, m["ranks"].split(", ")) if r not in absent]
            # The reporter: glog's `[Rank 0]:` in the message, else torch's `[rank0]:` prefix on the line.
            prefix = RANK_PREFIX.match(line)
            by, waited = m["by"] or (prefix["rank"] if prefix else by), m["ms"]
    if not absent:
        return None
    who = f"rank {absent[0]}" if len(absent) == 1 else f"ranks {', '.join(map(str, absent))}"
    return (
        f"{who} never reached the monitored barrier: rank {by} waited {waited} ms for {'it' if len(absent) == 1 else 'them'}; "
        f"the failure lies with {who} (stuck, slow or dead before the barrier), rank {by} only reported it"
    )
