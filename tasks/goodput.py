"""Reading a target's timeline back from Prefect: its verdict and escalation events, its recovery steps' task runs."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from relaunch.records.goodput import Observation, StepSpan, Timeline, from_event
from relaunch.vocabulary import Step

# Read from this long before the window: the run the window opens on was launched, and last seen, before it.
LOOKBACK = timedelta(days=1)
PAGE = 200


@task(name="collect_timeline", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 10])
def collect_timeline(target_name: str, start: datetime, end: datetime, known: list[Observation] | None = None) -> Timeline:
    """Everything relaunch recorded about the target from LOOKBACK before `start` to `end`.

    `known`: observations this flow run made itself, whose events the server may not have stored yet (the event
    persister writes in batches, seconds apart); one stored since is counted once (the same time and run)."""
    from prefect.client.orchestration import get_client

    since = start - LOOKBACK
    with get_client(sync_client=True) as client:
        events = _events(client, target_name, since, end)
        task_runs = _task_runs(client, target_name, since)
    timeline = Timeline(target=target_name)
    for e in events:
        if e.event == "relaunch.recovery.escalated":
            timeline.escalations.append(e.occurred)
        elif (o := from_event(e.occurred, e.event, e.payload)) is not None:
            timeline.observations.append(o)
    stored = {(o.at, o.run_id) for o in timeline.observations}
    timeline.observations += [o for o in known or [] if (o.at, o.run_id) not in stored and since <= o.at <= end]
    for t in task_runs:
        step = t.name.split("@", 1)[0]
        if step in Step._value2member_map_ and t.start_time is not None:
            timeline.steps.append(StepSpan(step=Step(step), started_at=t.start_time, ended_at=t.end_time or end))
    return timeline


def _events(client: Any, target_name: str, since: datetime, until: datetime) -> list[Any]:
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter, EventOrder, EventResourceFilter

    flt = EventFilter(
        occurred=EventOccurredFilter(since=since, until=until),
        event=EventNameFilter(prefix=["relaunch.verdict.", "relaunch.recovery.escalated"]),
        resource=EventResourceFilter(id=[f"relaunch.target.{target_name}"]),
        order=EventOrder.ASC,
    )
    page = client.read_events(filter=flt, limit=50)  # the server's most per page
    found = list(page.events)
    while page.next_page:
        page = client.read_events_page(page.next_page)
        found += page.events
    return found


def _task_runs(client: Any, target_name: str, since: datetime) -> list[Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags, TaskRunFilter, TaskRunFilterStartTime

    flows = FlowRunFilter(tags=FlowRunFilterTags(all_=[f"target:{target_name}"]))
    tasks = TaskRunFilter(start_time=TaskRunFilterStartTime(after_=since))
    found: list[Any] = []
    while True:
        page = client.read_task_runs(flow_run_filter=flows, task_run_filter=tasks, limit=PAGE, offset=len(found))
        found += page
        if len(page) < PAGE:
            return found
