"""`relaunch status [FLEET.yaml]`: one line per target: its run as it is now, from one cheap look at its host, beside
what the Prefect server already holds.

Per target (those of the fleet file, else every target in ~/.config/relaunch/targets):

* now and since when: the watch's look (relaunch/plans/status.py): `running` since the run's launch (or adoption),
  `dead` since its exit record was written (exit code named; since unknown where no exit was recorded), `stopped`
  (a person's stop), `not launched`, `foreign` (the state folder is another target's), `unreachable` (the host, with
  why). Fine: running, stopped, or an exit 0; the command exits 1 when a row is not fine;
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

Without a Prefect API configured, the rows hold only what the hosts know. Rows are assembled by `row` and `now_of` from
plain values, with no I/O; `look_all` reads the hosts, `gather` the server.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

from relaunch.config import Target
from relaunch.errors import RelaunchError, TransportError
from relaunch.judging.watching import Pulse
from relaunch.plans.status import launched_at
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


class NowState(str, Enum):
    """The run as one look at its host finds it."""

    RUNNING = "running"  # the recorded trainer lives
    EXITED = "exited"  # the trainer is gone with exit 0 (whether it finished, the last report or a check says)
    DEAD = "dead"  # the trainer is gone: a non-zero exit, or none recorded
    STOPPED = "stopped"  # a person stopped it (`relaunch stop`, tmux kill-session): left so until `relaunch recover`
    NOT_LAUNCHED = "not launched"  # no run on record
    FOREIGN = "foreign"  # the state folder is another target's
    UNREACHABLE = "unreachable"  # the host could not be reached
    UNKNOWN = "unknown"  # the host answered, but the look failed


# The states that need no person: a run that runs, one a person stopped, one that ended with exit 0.
FINE_NOW = frozenset({NowState.RUNNING, NowState.EXITED, NowState.STOPPED})


class Now(BaseModel):
    """The run as it is now, from one cheap look at its host (the watch's look)."""

    state: NowState
    since: datetime | None = Field(
        None, description="Running: its launch (or adoption); gone: when its exit was recorded; None: not known."
    )
    run_id: str | None = Field(None, description="The run on record.")
    pid: int | None = Field(None, description="Its recorded trainer PID.")
    exit_code: int | None = Field(None, description="The exit record, where one was written.")
    node: int | None = Field(None, description="A gang's node this is (its first node not fine, else node 0); None: one host.")
    detail: str = Field("", description="What the look found, in words.")

    @property
    def fine(self) -> bool:
        return self.state in FINE_NOW

    def cell(self) -> str:
        """The NOW column: `dead (exit 137)`, `running`, `unreachable`, with the node of a gang."""
        text = self.state.value + (f" (exit {self.exit_code})" if self.exit_code is not None and self.state is not NowState.RUNNING else "")
        return text + (f" on node {self.node}" if self.node is not None else "")


def now_of(pulse: Pulse, exit_at: datetime | None = None) -> Now:
    """What one look says of the run now. `exit_at`: when its exit record was written (the trainer's death)."""
    ids = {"run_id": pulse.run_id, "pid": pulse.pid, "exit_code": pulse.exit_code}
    if pulse.foreign:
        return Now(
            state=NowState.FOREIGN, detail=f"the state folder is another target's ({pulse.foreign}): give each target its own state_dir"
        )
    if pulse.run_id is None:
        if pulse.stopped:
            return Now(state=NowState.STOPPED, detail="stopped on purpose, no run on record: `relaunch recover` starts it")
        return Now(state=NowState.NOT_LAUNCHED, detail="no run on record: `relaunch recover` launches it")
    if pulse.pid_alive:
        stopping = "; a stop is recorded, and the trainer still lives" if pulse.stopped else ""
        return Now(state=NowState.RUNNING, since=launched_at(pulse.run_id), detail=f"its trainer (PID {pulse.pid}) lives{stopping}", **ids)
    if pulse.stopped:
        return Now(state=NowState.STOPPED, since=exit_at, detail="stopped on purpose: checks leave it so until `relaunch recover`", **ids)
    if pulse.exit_code == 0:
        return Now(state=NowState.EXITED, since=exit_at, detail=f"its trainer (PID {pulse.pid}) exited 0", **ids)
    if pulse.exit_code is not None:
        gone = f"trainer PID {pulse.pid} gone, exit {pulse.exit_code}"
    elif pulse.supervisor_alive:
        gone = f"trainer PID {pulse.pid} gone, its exit being recorded"
    else:
        gone = f"trainer PID {pulse.pid} gone, no exit recorded"
    return Now(state=NowState.DEAD, since=exit_at, detail=f"{gone}; `relaunch check` says why, `relaunch recover` restarts it", **ids)


def look_now(target: Target) -> Now:
    """One look at each of the target's hosts (a gang's every node); the run's Now is its first node that is not fine,
    else its first node's. A host that cannot be reached, or a look that fails, is said as such: never a death."""
    from relaunch.deciding.gang import indexed
    from relaunch.plans.status import parse_exit_time, plan_exit_time, plan_look
    from relaunch.plans.watch import parse_pulse
    from relaunch.wire.transport import run, transport_for

    nodes = indexed(target)
    found = []
    for k, node in nodes:
        try:
            transport = transport_for(node.host)
            pulse = parse_pulse(run(transport, plan_look(node)).stdout)
            exit_at = None
            if not pulse.pid_alive and pulse.run_id and pulse.exit_code is not None:
                exit_at = parse_exit_time(run(transport, plan_exit_time(node, pulse.run_id), check=False).stdout)
            now = now_of(pulse, exit_at)
        except TransportError as exc:
            now = Now(state=NowState.UNREACHABLE, detail=_first_line(exc))
        except RelaunchError as exc:
            now = Now(state=NowState.UNKNOWN, detail=f"the look failed: {_first_line(exc)}")
        found.append(now.model_copy(update={"node": k}) if nodes.gang else now)
    return next((n for n in found if not n.fine), found[0])


def look_all(targets: list[Target]) -> list[Now]:
    """Every target's look, all at once."""
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(targets)))) as pool:
        return list(pool.map(look_now, targets))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def clip(text: str, limit: int) -> str:
    """TEXT on one line, at most LIMIT characters, cut between words (a single word longer than that is cut)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    if text[limit - 3] != " " and " " in cut:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip() + "..."


class StatusRow(BaseModel):
    target: str = Field(description="The target's name.")
    host: str = Field(description="Where it runs (user@host:port, via jump hosts, in a container).")
    now: Now | None = Field(None, description="The run as one look at its host found it now.")
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
    now: Now | None = None,
) -> StatusRow:
    """REPORTS and RECOVERIES (end time, state name) in any order; NOW, what the host says."""
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
        now=now,
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


def render(rows: list[StatusRow], now: datetime, records: bool = True) -> str:
    """The table; without `records` (no Prefect API to read), only what the hosts say."""
    header = ("TARGET", "HOST", "NOW", "SINCE", "LAST REPORT", "LAST RECOVERY", "GOODPUT", "NIGHTLY", "MESSAGE")
    lines = []
    for r in rows:
        look = r.now or Now(state=NowState.UNKNOWN)
        report = f"{r.verdict.value} since {_ago(r.since, now)}" if r.verdict else "-"
        recovery = f"{_ago(r.last_recovery, now)} ({r.last_recovery_state})" if r.last_recovery else "-"
        message = look.detail if not look.fine or not r.message else r.message
        lines.append(
            (r.target, r.host, look.cell(), _ago(look.since, now), report, recovery, r.goodput or "-", r.nightly or "-", clip(message, 100))
        )
    keep = range(len(header)) if records else (0, 1, 2, 3, 8)
    table = [tuple(line[i] for i in keep) for line in [header, *lines]]
    widths = [max(len(x[i]) for x in table) for i in range(len(keep))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in table)


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
