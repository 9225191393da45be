"""`relaunch status [FLEET.yaml]`: one line per target, from what the Prefect server already holds.

Per target (those of the fleet file, else every target in ~/.config/relaunch/targets):

* verdict and since when: the newest report artifact (`check-training-NAME`, `recover-training-NAME`: each run
  publishes one, its description `VERDICT: message`), and the oldest report of the unbroken run of that verdict
  before it; a recovery breaks the run (it stopped what ran and launched again, after a person's stop too): its own
  report is where the run starts, and a recovery that ended between two reports without one ends it there;
* last recovery: the newest `recover-training` flow run tagged `target:NAME` (a nightly check's subflow too) that
  ended, with its end state;
* goodput: the hook GOODPUT_KEY: the newest artifact keyed `goodput-NAME` (whatever flow publishes it): the last
  night's `goodput_percent` of its table (flows/common.py publish_goodput), else a first word of its description
  that is a percentage (e.g. `93.1%`); `-` where there is neither;
* nightly: the `check-training/nightly-NAME` deployment's schedule, `paused`, or `-` when not deployed.

Rows are assembled by `row` from plain values, with no I/O; `gather` reads the server.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from relaunch.config import Target
from relaunch.vocabulary import Verdict

# The hook for goodput: any flow (or person) that publishes an artifact under this key for a target fills the column.
GOODPUT_KEY = "goodput-{name}"
# How far back "since" looks (reports, newest first).
HISTORY = 50


class Report(BaseModel):
    """A published report, as status reads it."""

    at: datetime
    verdict: Verdict | None
    message: str = ""
    flow: str = Field("", description="The flow that published it (check-training, recover-training); empty: unknown.")


class StatusRow(BaseModel):
    target: str = Field(description="The target's name.")
    host: str = Field(description="Where it runs (user@host:port, via jump hosts, in a container).")
    verdict: Verdict | None = Field(None, description="The newest report's verdict; None: no report yet.")
    since: datetime | None = Field(None, description="When the verdict first read this, in the unbroken run of reports up to now.")
    last_report: datetime | None = Field(None, description="When the newest report was published.")
    message: str = Field("", description="The newest report's one-line message.")
    last_recovery: datetime | None = Field(None, description="When the newest recover-training run of the target ended.")
    last_recovery_state: str | None = Field(None, description="That run's end state (Completed, Failed, Crashed, ...).")
    goodput: str | None = Field(None, description=f"The newest `{GOODPUT_KEY}` artifact's description, first word.")
    nightly: str | None = Field(None, description="The nightly check's schedule (`0 3 * * * UTC`), `paused`, or None: not deployed.")


def parse_report(at: datetime, description: str | None, flow: str = "") -> Report:
    head, _, message = (description or "").partition(": ")
    try:
        verdict: Verdict | None = Verdict(head.strip())
    except ValueError:
        verdict = None
    return Report(at=at, verdict=verdict, message=message.strip(), flow=flow)


def goodput_of(description: str | None, data: object = None) -> str | None:
    """What the GOODPUT column says: the last night's percentage of a goodput table (its rows are the nights, then the
    total), else the description's first word where it is a percentage; None otherwise (never a word like `goodput`)."""
    import json

    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            data = None
    if isinstance(data, list):
        rows = [r for r in data if isinstance(r, dict) and isinstance(r.get("goodput_percent"), (int, float))]
        nights = [r for r in rows if r.get("night") != "total"] or rows
        if nights:
            return f"{float(nights[-1]['goodput_percent']):.1f}%"
    first = (description or "").split()[:1]
    if first and first[0].endswith("%"):
        try:
            float(first[0][:-1])
        except ValueError:
            return None
        return first[0]
    return None


def row(
    target: Target,
    reports: list[Report],
    recoveries: list[tuple[datetime, str]],
    goodput: str | None,
    nightly: str | None,
) -> StatusRow:
    """REPORTS and RECOVERIES (end time, state name) in any order."""
    reports = sorted(reports, key=lambda r: r.at, reverse=True)
    newest = reports[0] if reports else None
    since = None
    ended = sorted(at for at, _ in recoveries)
    for r in reports:
        if r.verdict != newest.verdict:  # type: ignore[union-attr]
            break
        if since is not None and any(r.at < at < since for at in ended):
            break  # a recovery ended between this report and the newer one: the run since then is another
        since = r.at
        if r.flow == "recover-training":
            break  # the recovery stopped what ran and launched again: the run starts here
    last = max(recoveries, default=None, key=lambda r: r[0])
    return StatusRow(
        target=target.name,
        host=target.host.label,
        verdict=newest.verdict if newest else None,
        since=since,
        last_report=newest.at if newest else None,
        message=newest.message if newest else "",
        last_recovery=last[0] if last else None,
        last_recovery_state=last[1] if last else None,
        goodput=goodput_of(goodput),
        nightly=nightly,
    )


def _ago(when: datetime | None, now: datetime) -> str:
    if when is None:
        return "-"
    seconds = max(0, int((now - when).total_seconds()))
    # Hours up to two days: "29h ago" says more about last night than "1d ago".
    for unit, size, least in (("d", 86400, 2 * 86400), ("h", 3600, 3600), ("m", 60, 60)):
        if seconds >= least:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def render(rows: list[StatusRow], now: datetime) -> str:
    header = ("TARGET", "HOST", "VERDICT", "SINCE", "LAST RECOVERY", "GOODPUT", "NIGHTLY", "MESSAGE")
    lines = [
        (
            r.target,
            r.host,
            r.verdict.value if r.verdict else "-",
            _ago(r.since, now),
            f"{_ago(r.last_recovery, now)} ({r.last_recovery_state})" if r.last_recovery else "-",
            r.goodput or "-",
            r.nightly or "-",
            r.message[:80],
        )
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [header, *lines]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header, *lines])


def gather(targets: list[Target]) -> list[StatusRow]:
    return asyncio.run(_gather(targets))


async def _gather(targets: list[Target]) -> list[StatusRow]:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        return list(await asyncio.gather(*(_one(client, t) for t in targets)))


async def _one(client: Any, target: Target) -> StatusRow:
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import ArtifactSort, FlowRunSort
    from prefect.exceptions import ObjectNotFound

    from relaunch.cli.deploy import NIGHTLY_SLUG, deployment_names
    from relaunch.flows.outcome import run_tags
    from relaunch.tasks.common import artifact_key

    keys = [artifact_key(flow, target.name) for flow in ("check-training", "recover-training")]
    found = await client.read_artifacts(
        artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys)), sort=ArtifactSort.CREATED_DESC, limit=HISTORY
    )
    flows = dict(zip(keys, ("check-training", "recover-training"), strict=True))
    reports = [parse_report(a.created, a.description, flows.get(a.key or "", "")) for a in found if a.created]
    ended = await client.read_flow_runs(
        flow_filter=FlowFilter(name=FlowFilterName(any_=["recover-training"])),
        flow_run_filter=FlowRunFilter(
            tags=FlowRunFilterTags(all_=[run_tags(target)[0]]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.COMPLETED, StateType.FAILED, StateType.CRASHED])),
        ),
        sort=FlowRunSort.END_TIME_DESC,
        limit=HISTORY,
    )
    recoveries = [(r.end_time, r.state.name) for r in ended if r.end_time and r.state]
    goodput = await client.read_artifacts(
        artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key(GOODPUT_KEY.format(name=target.name))])),
        sort=ArtifactSort.CREATED_DESC,
        limit=1,
    )
    try:
        deployment = await client.read_deployment_by_name(deployment_names(target.name)[0])
    except ObjectNotFound:
        nightly = None
    else:
        schedules = [s for s in deployment.schedules if s.slug == NIGHTLY_SLUG] or deployment.schedules
        on = [s for s in schedules if s.active]
        if deployment.paused or not on:
            nightly = "paused"
        else:
            s = on[0].schedule
            nightly = f"{getattr(s, 'cron', None) or s} {getattr(s, 'timezone', None) or ''}".strip()
    return row(target, reports, recoveries, goodput_of(goodput[0].description, goodput[0].data) if goodput else None, nightly)
