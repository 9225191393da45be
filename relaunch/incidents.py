"""Incidents across the fleet: the same failure on several hosts within a few minutes is one cause (a shared file system
full, a driver update, a partition), not many. Pure: flows/fleet.py emits one event per incident and recovers one of
its targets first; the others follow only once that one ends healthy."""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from relaunch.verdicts import Cause, Verdict


class Sick(BaseModel):
    """One sick target as the fleet check found it."""

    index: int = Field(description="Its place in the fleet's list of targets.")
    target: str
    host: str = Field(description="The host's name (one host with two sick targets is not an incident).")
    verdict: Verdict
    cause: Cause | None = None
    failed_at: datetime = Field(description="When it failed: its log's last write where the poll saw it, else the check.")


class Incident(BaseModel):
    verdict: Verdict
    cause: Cause | None = None
    members: list[Sick] = Field(description="In fleet order; the first is recovered first, the others are held until it is healthy.")
    window_minutes: float

    @property
    def label(self) -> str:
        return f"{self.verdict.value}/{self.cause.value}" if self.cause else self.verdict.value

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(m.host for m in self.members))

    def summary(self) -> str:
        first, last = min(m.failed_at for m in self.members), max(m.failed_at for m in self.members)
        return (
            f"one incident: {self.label} on {len(self.hosts)} hosts ({', '.join(self.hosts)}) within "
            f"{(last - first).total_seconds() / 60:.1f} min; {self.members[0].target} is recovered first, the others wait for it"
        )


def incidents(sick: list[Sick], window_minutes: float, min_hosts: int = 2) -> list[Incident]:
    """Groups of one verdict and cause on at least `min_hosts` hosts whose failures lie within `window_minutes` of the
    group's first; a target belongs to one incident at most."""
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
