"""How a flow run ends where people look: its final state, its events, its tags.

A run ends `Completed` only when the target ends healthy, starting or finished. Anything else (an
escalation, attempts used up, a sick run nobody asked to recover) ends `Failed` with a one-line
message; the report is still the state's data and the flow run's artifact. A green run that gave up
would be a lie.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from prefect.client.schemas.objects import State
from prefect.context import FlowRunContext, TagsContext
from prefect.states import Failed

from relaunch.config import Target
from relaunch.report import Report
from relaunch.tasks.common import log

R = TypeVar("R")


def is_fine(report: Report) -> bool:
    """The verdict a nightly check may end on without a person being told (Verdict.is_fine)."""
    return report.verdict is not None and report.verdict.is_fine()


def one_line(report: Report) -> str:
    verdict = report.verdict.value if report.verdict else "no verdict"
    cause = f" ({report.cause.value})" if report.cause else ""
    first = " ".join((report.message or "").split())
    return f"{report.target} on {report.host}: {verdict}{cause}: {first}"[:480]


def final_state(report: Report) -> Report | State:
    """The report itself (Completed) when the target is fine; else a Failed state carrying it."""
    if is_fine(report):
        return report
    return Failed(message=one_line(report), data=report)


def result_of(state: State, kind: type[R]) -> R:
    """The `kind` a flow run ended with, whether it Completed or Failed (a Failed ending carries it as its data); raises
    what a step raised."""
    result = state.result(raise_on_failure=False)
    if isinstance(result, kind):
        return result
    if isinstance(result, BaseException):
        raise result
    raise TypeError(f"flow run ended {state.type.value} without a {kind.__name__}: {result!r}")


def report_of(state: State) -> Report:
    """The Report a flow run ended with, whether it Completed or Failed; raises what a step raised."""
    return result_of(state, Report)


def emit(
    event: str,
    target: Target,
    report: Report | None = None,
    facts: dict[str, Any] | None = None,
    occurred: datetime | None = None,
    **labels: Any,
) -> None:
    """A Prefect event about the target (`relaunch.target.NAME`), related to the flow run emitting it; `facts` join
    its payload (numbers stay numbers there, where labels are strings)."""
    try:
        from prefect.events import emit_event

        resource = {
            "prefect.resource.id": f"relaunch.target.{target.name}",
            "prefect.resource.name": target.name,
            "relaunch.host": target.host.label,
        }
        resource.update({f"relaunch.{k}": str(v) for k, v in labels.items() if v is not None})
        related = []
        ctx = FlowRunContext.get()
        if ctx and ctx.flow_run:
            related.append(
                {
                    "prefect.resource.id": f"prefect.flow-run.{ctx.flow_run.id}",
                    "prefect.resource.role": "flow-run",
                    "prefect.resource.name": ctx.flow_run.name,
                }
            )
        payload = {**(_payload(report) if report else {}), **(facts or {})}
        emit_event(event=event, resource=resource, related=related, payload=payload, occurred=occurred)
    except Exception as exc:  # an event is a notice, never a reason to fail a recovery
        log().warning("could not emit %s: %s", event, exc)


def _payload(report: Report) -> dict[str, Any]:
    last = report.attempts[-1] if report.attempts else None
    return {
        "verdict": report.verdict.value if report.verdict else None,
        "cause": report.cause.value if report.cause else None,
        "message": report.message,
        "summary": one_line(report),
        "evidence": (last.evidence if last else [])[:5],
        "attempts": len(report.attempts),
    }


def tag_flow_run(target: Target) -> None:
    """Tag the running flow run with the target and host, so the UI filters by them (deployment runs too)."""
    ctx = FlowRunContext.get()
    if not ctx or not ctx.flow_run:
        return
    wanted = run_tags(target)
    if all(t in ctx.flow_run.tags for t in wanted):
        return
    try:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            client.update_flow_run(ctx.flow_run.id, tags=sorted({*ctx.flow_run.tags, *wanted}))
    except Exception as exc:
        log().warning("could not tag the flow run: %s", exc)


def untagged_tasks() -> TagsContext:
    """Task runs inside without the run's tags (the flow run keeps them, for the UI and automations).

    Prefect checks every tagged task run against tag concurrency limits: two API writes per task run, which a
    SQLite server busy with the run's logs and events answers `503 database is locked`, and the client retries
    ~2 s later (measured: two such stalls in one full recovery of the demo). Hosts are serialised by relaunch's
    own global limit (flows/recover.py host_slot), not by tags.
    """
    return TagsContext(current_tags=set())


def run_tags(target: Target) -> list[str]:
    return [f"target:{target.name}", f"host:{target.host.hostname}"]
