"""The findings of a check: its verdict with cause and evidence (Diagnosis), the metrics it read, and the progress carried from poll to poll. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, Field

from relaunch.judging.snapshot import HealthSnapshot
from relaunch.vocabulary import Cause, Verdict


class Metrics(BaseModel):
    last_step: int | None = Field(None, description="Highest step number in the log.")
    first_nonfinite_step: int | None = Field(None, description="Step of the first step line in the tail whose loss is nan or inf.")
    steps_seen: int = Field(0, description="Step lines in the log tail.")
    tokens_per_second: float | None = Field(None, description="Median of the last three throughput readings.")
    gpu_memory_used_mib: list[int] = Field(default_factory=list)
    gpu_utilization_percent: list[int] = Field(default_factory=list)


class Diagnosis(BaseModel):
    verdict: Verdict
    cause: Cause | None = None
    package: str | None = Field(None, description="For missing_dependency: the distribution to install.")
    summary: str = Field("", description="One line a person reads first.")
    checkpoint: str | None = Field(
        None, description="The checkpoint the attempt was launched with (for broken_checkpoint: the one to skip)."
    )
    disk_still_full: bool = Field(False, description="disk_full and the poll still finds less free space than the minimum.")
    rendezvous_incomplete: bool = Field(
        False, description="distributed_failure where the ranks never all met: a relaunch would wait for the same missing node."
    )
    evidence: list[str] = Field(default_factory=list, description="The log or signal lines that decided.")
    metrics: Metrics = Field(default_factory=Metrics)
    watching: str | None = Field(
        None,
        description="What the poll must still see before it may settle (a quiet run's history too short for its stall "
        "window, its stacks not yet sampled): the verdict stands for now and stops nothing.",
    )
    want_stacks: bool = Field(False, description="The next poll should sample the tree's Python stacks (quiet log, busy tree).")
    repo_dir_missing: str | None = Field(
        None, description="The target's repo_dir, where the host has no such folder and nothing is on record: a target to fix, not a run."
    )
    no_step_fixes: str | None = Field(
        None,
        description="Why no recovery step (venv, code, cache, checkpoint) can change this death, read from the evidence (the "
        "command line itself refused, exit 2): relaunched once to see it repeat, then escalated with what a person must fix.",
    )

    @property
    def cause_line(self) -> str:
        """The root cause's own line as the trainer or a step printed it (never relaunch's bookkeeping), else the summary."""
        return cause_line(self.evidence) or self.summary

    @property
    def settled(self) -> bool:
        return self.verdict is not Verdict.STARTING and self.watching is None


@dataclass(frozen=True)
class Progress:
    """What earlier polls of one attempt saw; advanced by `advance`, never by I/O."""

    last_step: int | None = None
    step_changed_at: float | None = None  # seconds since launch when last_step last changed
    # The first step line, where a poll saw it come (a run first seen already stepping leaves both None).
    first_step: int | None = None
    first_step_at: float | None = None  # seconds since launch: the log's last write when a poll first found it
    step_intervals: tuple[float, ...] = ()
    log_size_bytes: int = 0
    log_grew_at: float | None = None
    gpu_memory_mib: int = 0
    gpu_rose_at: float | None = None
    gpu_busy_at: float | None = None
    gpu_all_zero_polls: int = 0
    checkpoint_written_at: float | None = None  # seconds since launch of the newest write into checkpoint_dir seen
    polls: int = 0
    # py-spy samples of a quiet, busy tree: (host time, every thread of every process waiting).
    stack_samples: tuple[tuple[float, bool, str], ...] = ()


# relaunch's own lines in a trainer's log and evidence (its launch banner, its exit record, the exit code it read):
# what happened around the death, never its cause.
BOOKKEEPING = re.compile(r"^\s*(\[relaunch\]|exit code -?\d+|no exit code|launcher: exit code)")


def own_lines(lines: list[str]) -> list[str]:
    """The lines of evidence that are the trainer's or a step's own words, in their order."""
    return [line for line in lines if line.strip() and not BOOKKEEPING.match(line)]


def cause_line(evidence: list[str]) -> str:
    """The evidence line a person reads first: the first that is not relaunch's own bookkeeping ("" where none is)."""
    return next(iter(own_lines(evidence)), "")


def run_pids(snap: HealthSnapshot) -> set[int]:
    return {pid for pid in (snap.pid, *snap.tree_pids) if pid}


def last_log_lines(snap: HealthSnapshot, n: int) -> list[str]:
    return [line.rstrip() for line in snap.log_tail if line.strip()][-n:]
