"""Reporting shared by the flows: artifacts in the UI, attempts from health results."""

from __future__ import annotations

from prefect.context import FlowRunContext

from relaunch.ledger import Ledger
from relaunch.playbook import Action
from relaunch.report import Attempt, Report
from relaunch.tasks.common import artifact_key, log
from relaunch.tasks.health import HealthResult


def attempt_from(number: int, health: HealthResult, action: Action, why: str) -> Attempt:
    d = health.diagnosis
    return Attempt(
        number=number,
        verdict=d.verdict,
        cause=d.cause,
        package=d.package,
        summary=d.summary,
        action=action,
        why=why,
        evidence=d.evidence,
        metrics=d.metrics,
    )


def report_key(report: Report) -> str:
    return artifact_key(report.flow, report.target)


def publish(report: Report) -> None:
    """Markdown report and GPU table as artifacts of the flow run; nothing outside a run."""
    if FlowRunContext.get() is None:
        return
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    try:
        create_markdown_artifact(
            markdown=report.markdown(),
            key=report_key(report),
            description=f"{report.verdict.value if report.verdict else 'none'}: {report.message}"[:500],
        )
        if report.gpus:
            create_table_artifact(
                table=[g.model_dump() for g in report.gpus],
                key=report_key(report) + "-gpus",
                description="GPU memory and utilisation at the last poll",
            )
    except Exception as exc:  # the report is also returned and logged: an artifact failure must not fail the flow
        log().warning("could not publish artifacts: %s", exc)


def publish_ledger(ledger: Ledger) -> None:
    """The host's GPU ledger as a table artifact (`gpu-ledger-HOST`), where it holds a GPU; nothing outside a run."""
    if FlowRunContext.get() is None or not ledger.gpus:
        return
    from prefect.artifacts import create_table_artifact

    try:
        create_table_artifact(
            table=ledger.rows(),
            key=artifact_key("gpu-ledger", ledger.host),
            description=f"GPUs never given back to a relaunch on {ledger.host} until `relaunch gpus clear {ledger.host} BUS_ID`",
        )
    except Exception as exc:  # the ledger itself is in its Variable: a missing table must not fail the flow
        log().warning("could not publish the GPU ledger: %s", exc)
