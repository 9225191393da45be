"""How a flow run ends where people look: its final state, its events, its tags.

A run ends `Completed` only when the target ends healthy, starting or finished (named `Recovered` when a
recovery brought it back). Anything else (an escalation, attempts used up, a sick run nobody asked to
recover) ends `Failed` with a one-line message and what to do (named `Escalated` when a person must act);
the report is still the state's data and the flow run's artifact. A green run that gave up would be a lie.
A refusal (a RelaunchError: no usable checkpoint, a preflight problem, a state folder of another target)
is an escalation too, never a crash: the error is the state's data, logged at ERROR without a traceback.
The run is renamed by what happened: `recover-NAME: crashed (killed) -> recovered`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from prefect.client.schemas.objects import State
from prefect.context import FlowRunContext, TagsContext
from prefect.states import Completed, Failed

from relaunch.config import Target
from relaunch.errors import RelaunchError
from relaunch.records.report import Report
from relaunch.tasks.common import log

R = TypeVar("R")


# A state message holds the whole one line (a restart storm names every night of its cause) and what to do.
MESSAGE_CHARS = 2000


def is_fine(report: Report) -> bool:
    """The verdict a nightly check may end on without a person being told (Verdict.is_fine)."""
    return report.verdict is not None and report.verdict.is_fine()


def one_line(report: Report) -> str:
    verdict = report.verdict.value if report.verdict else "no verdict"
    cause = f" ({report.cause.value})" if report.cause else ""
    # What to do follows in its own part of an ending (ending), never twice.
    first = " ".join((report.message or "").split(" | what to do:", 1)[0].split())
    return f"{report.target} on {report.host}: {verdict}{cause}: {first}"[:MESSAGE_CHARS]


def final_state(report: Report, refused: RelaunchError | None = None) -> Report | State:
    """The report itself (Completed) when the target is fine and nothing was done; Completed named Recovered when a
    recovery brought it back; else Failed: named Escalated when a person must act (the playbook escalated, or a refusal:
    `refused` is then the state's data, so a Python caller of the flow still gets the exception), carrying the report.
    The message says what to do."""
    outcome = report.outcome()
    if refused is not None:
        return Failed(name="Escalated" if outcome == "escalated" else None, message=ending(report, refused), data=refused)
    if is_fine(report):
        return Completed(name="Recovered", message=one_line(report), data=report) if outcome == "recovered" else report
    return Failed(name="Escalated" if outcome == "escalated" else None, message=ending(report), data=report)


def what_to_do(report: Report, refused: RelaunchError | None = None) -> str:
    """The next step for a person, for an ending that is not fine."""
    text = str(refused) if refused is not None else report.message
    if "what to do:" in text:
        return " ".join(text.split("what to do:", 1)[1].split())
    outcome = report.outcome()
    if outcome == "busy":
        return "wait for the recovery holding the target to end (its flow run is named in the lock's owner line)"
    last = report.attempts[-1] if report.attempts else None
    if refused is None and last is not None and last.repo_dir_missing and not last.acted:
        # Nothing to recover from: no recovery could launch without the training code (its preflight would stop).
        return f"fix repo_dir in the target file, or put the training code's checkout at {last.repo_dir_missing}"
    if outcome == "not recovered":
        return "recover it: run recover-training on the target (`relaunch recover TARGET.yaml`), or look at the report artifact first"
    if refused is not None:
        return f"fix what the {type(refused).__name__} above names (nothing was changed past it), then run recover-training again"
    return f"look at the report artifact ({report.flow}-{report.target}): the playbook's reason is above; fix it, then run recover-training again"


def ending(report: Report, refused: RelaunchError | None = None) -> str:
    """The Failed state's message: the one line, then what to do (both within the UI's state message)."""
    head = one_line(report) if refused is None else f"{report.target} on {report.host}: {gist(refused)}"
    todo = f" | what to do: {what_to_do(report, refused)}"
    room = max(200, MESSAGE_CHARS - len(todo))
    return (head if len(head) <= room else head[: room - 3] + "...") + todo[: MESSAGE_CHARS - min(len(head), room)]


def gist(exc: RelaunchError) -> str:
    """A refusal in a few words: its problem(s) where it names them (CheckpointUnusable, PreflightFailed), else its
    first line."""
    problem = getattr(exc, "problem", None) or "; ".join(getattr(exc, "problems", None) or [])
    text = problem or (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {' '.join(text.split())}"


def conclude(report: Report, refused: RelaunchError | None = None) -> Report | State:
    """How the run ends where people look: named by what happened (`recover-NAME: crashed (killed) -> recovered`), an
    ERROR line saying what to do for every ending that is not fine (no traceback for a refusal), and the final state."""
    name_flow_run(report.headline())
    if refused is not None or not is_fine(report):
        text = str(refused) if refused is not None else report.message
        log().error(
            "%s: %s: %s\n  what to do: %s",
            report.target,
            report.headline(),
            text.split("\n  what to do:", 1)[0],
            what_to_do(report, refused),
        )
    return final_state(report, refused)


def name_flow_run(what: str) -> None:
    """Rename the running flow run `NAME: WHAT`, once what happened is known: NAME is the run's name as it started
    (`recover-TARGET` from `flow_run_name`, or the one a person gave it), since Prefect names a run only as it starts.
    Events emitted after it carry the new name. Nothing outside a run."""
    ctx = FlowRunContext.get()
    if not ctx or not ctx.flow_run:
        return
    name = f"{ctx.flow_run.name}: {what}"[:200]
    try:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            client.update_flow_run(ctx.flow_run.id, name=name)
        ctx.flow_run.name = name
    except Exception as exc:  # a name is a view: never a reason to fail the run
        log().warning("could not rename the flow run: %s", exc)


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
