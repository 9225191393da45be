"""Incidents across the fleet: the same failure on several hosts within a few minutes is one cause (a shared file system
full, a driver update, a partition), not many. Pure: flows/fleet.py emits one event per incident and recovers one of
its targets first; the others follow only once that one ends healthy.

Hosts that could not be reached (their check failed: no verdict) within the window are one incident of their own, a
network partition or hosts gone down: nothing is stopped or launched on any of its hosts, not even a sick target there
whose own check got through, while the targets of other hosts are recovered as usual."""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from relaunch.vocabulary import Cause, Verdict

UNREACHABLE = "unreachable"


class Sick(BaseModel):
    """One sick target as the fleet check found it, or one whose host could not be reached (no verdict)."""

    index: int = Field(description="Its place in the fleet's list of targets.")
    target: str
    host: str = Field(description="The host's name (one host with two sick targets is not an incident).")
    verdict: Verdict | None = Field(description="What the check found; None: the check failed, the host could not be reached.")
    cause: Cause | None = None
    failed_at: datetime = Field(description="When it failed: its log's last write where the poll saw it, else the check.")


class Incident(BaseModel):
    verdict: Verdict | None = Field(description="The members' verdict; None: their hosts could not be reached.")
    cause: Cause | None = None
    members: list[Sick] = Field(description="In fleet order; the first is recovered first, the others are held until it is healthy.")
    window_minutes: float

    @property
    def unreachable(self) -> bool:
        """Hosts the check could not reach: a partition, never recovered (nothing can be stopped or launched there)."""
        return self.verdict is None

    @property
    def label(self) -> str:
        if self.verdict is None:
            return UNREACHABLE
        return f"{self.verdict.value}/{self.cause.value}" if self.cause else self.verdict.value

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(m.host for m in self.members))

    def summary(self) -> str:
        first, last = min(m.failed_at for m in self.members), max(m.failed_at for m in self.members)
        then = (
            "a network partition or hosts down: nothing is stopped or launched on them; once they answer again, the next check judges them"
            if self.unreachable
            else f"{self.members[0].target} is recovered first, the others wait for it"
        )
        return (
            f"one incident: {self.label} on {len(self.hosts)} hosts ({', '.join(self.hosts)}) within "
            f"{(last - first).total_seconds() / 60:.1f} min; {then}"
        )


def incidents(sick: list[Sick], window_minutes: float, min_hosts: int = 2) -> list[Incident]:
    """Groups of one verdict and cause on at least `min_hosts` hosts whose failures lie within `window_minutes` of the
    group's first; a target belongs to one incident at most. Unreachable hosts are grouped first, and a sick target on
    one of a partition's hosts joins no other incident: it is cut off (`cut_off`), so it can be no incident's first.
    Only failures group (`Verdict.is_failure`): targets never launched, on however many hosts, are no incident."""
    partitions = _grouped([s for s in sick if s.verdict is None], window_minutes, min_hosts)
    cut = {host for incident in partitions for host in incident.hosts}
    failed = [s for s in sick if s.verdict is not None and s.verdict.is_failure() and s.host not in cut]
    return partitions + _grouped(failed, window_minutes, min_hosts)


def _grouped(sick: list[Sick], window_minutes: float, min_hosts: int) -> list[Incident]:
    out: list[Incident] = []
    window = timedelta(minutes=window_minutes)
    keys = list(dict.fromkeys((s.verdict, s.cause) for s in sick))
    for verdict, cause in keys:
        same = sorted((s for s in sick if (s.verdict, s.cause) == (verdict, cause)), key=lambda s: s.failed_at)
        while same:
            group = [s for s in same if s.failed_at - same[0].failed_at <= window]
            same = same[len(group) :]
            if len({s.host for s in group}) >= min_hosts:
                out.append(
                    Incident(verdict=verdict, cause=cause, members=sorted(group, key=lambda s: s.index), window_minutes=window_minutes)
                )
    return out


def cut_off(found: list[Incident], sick: list[Sick]) -> dict[int, Incident]:
    """The sick targets (by fleet index) on a host of an unreachable incident, each with that incident: never recovered
    while it lasts, though their own check got through (a link that comes and goes may drop a recovery half-way)."""
    hosts = {host: incident for incident in found if incident.unreachable for host in incident.hosts}
    return {s.index: hosts[s.host] for s in sick if s.verdict is not None and s.host in hosts}
