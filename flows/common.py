"""Reporting shared by the flows: artifacts in the UI, attempts from health results."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prefect.context import FlowRunContext

from relaunch.deciding.ledger import Ledger
from relaunch.records import goodput
from relaunch.records.goodput import Goodput
from relaunch.records.report import Attempt, Report
from relaunch.tasks.common import artifact_key, log
from relaunch.tasks.health import HealthResult
from relaunch.vocabulary import Action


def attempt_from(number: int, health: HealthResult, action: Action, why: str, acted: bool = True) -> Attempt:
    """The attempt a health check makes; `acted` false: ACTION is only what would be done (nothing was)."""
    d = health.diagnosis
    return Attempt(
        number=number,
        verdict=d.verdict,
        cause=d.cause,
        package=d.package,
        summary=d.summary,
        action=action,
        acted=acted,
        why=why,
        evidence=d.evidence,
        metrics=d.metrics,
        observation=health.observation,
        nodes=health.nodes,
        repo_dir_missing=d.repo_dir_missing,
    )


def publish_goodput(report: Report, days: float = 7.0) -> Goodput | None:
    """On a nightly run (tagged `nightly`, as the nightly deployments' runs are): the target's goodput table (per night
    and in total) and its markdown trend, as artifacts of the flow run. The check's own verdicts are counted from its
    report: their events may not be stored yet."""
    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None or "nightly" not in ctx.flow_run.tags:
        return None
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    from relaunch.tasks.goodput import collect_timeline

    try:
        known = [a.observation for a in report.attempts if a.observation is not None]
        now = datetime.now(UTC)
        found = goodput.report(collect_timeline(report.target, now - timedelta(days=days), now, known), days, now)
        create_table_artifact(
            table=goodput.table(found),
            key=artifact_key("goodput", report.target),
            description=f"goodput of {report.target}: minutes per category",
        )
        create_markdown_artifact(markdown=goodput.trend_markdown(found), key=artifact_key("goodput", report.target, "trend"))
        return found
    except Exception as exc:  # goodput is a view of the past: never a reason to fail tonight's check
        log().warning("could not publish goodput: %s", exc)
        return None


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
