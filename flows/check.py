"""check-training: the health check; with `recover`, hands a sick run to recover-training as a subflow.

A run that is healthy, finished or still starting is only recorded: nothing on the host changes, and
no second trainer is ever started beside a live one (recover-training checks again before it acts).
"""

from __future__ import annotations

from prefect import flow

from flows.common import attempt_from, publish
from flows.recover import recover_training
from relaunch.config import Target
from relaunch.errors import RelaunchError
from relaunch.playbook import remedy
from relaunch.report import Report
from relaunch.verdicts import Verdict
from tasks.health import check_health

# Verdicts worth a recovery. healthy / finished / starting are left alone.
RECOVERABLE = frozenset({Verdict.CRASHED, Verdict.STALLED, Verdict.DEGRADED, Verdict.UNKNOWN})


@flow(name="check-training", flow_run_name="check-{target.name}", log_prints=True)
def check_training(target: Target, recover: bool = False) -> Report:
    """Poll the trainer until its verdict settles and report it; with `recover`, recover a crashed, stalled, degraded or never-launched run."""
    report = Report(target=target.name, host=target.host.label, flow="check-training")
    health = check_health(target)
    action, why = remedy(health.diagnosis)
    verdict = health.diagnosis.verdict
    act = recover and verdict in RECOVERABLE
    report.attempts.append(attempt_from(1, health, action, f"recovering through recover-training: {why}" if act else f"would do: {why}"))
    report.gpus = health.snapshot.gpus
    if not act:
        report.finish(health.diagnosis.summary)
        publish(report)
        return report
    try:
        recovery = recover_training(target)
    except RelaunchError as exc:
        report.finish(f"check found {verdict.value}; recover-training failed: {exc}")
        publish(report)
        raise
    merge_recovery(report, recovery)
    publish(report)
    return report


def merge_recovery(report: Report, recovery: Report) -> Report:
    """The check's own attempt first, then the recovery's attempts (renumbered after it); verdict from the recovery."""
    first = report.attempts[0]
    offset = len(report.attempts)
    report.attempts += [a.model_copy(update={"number": a.number + offset}) for a in recovery.attempts]
    report.preflight = recovery.preflight
    report.gpus = recovery.gpus or report.gpus
    label = first.verdict.value + (f" ({first.cause.value})" if first.cause else "")
    return report.finish(f"check found {label}; recover-training: {recovery.message}")
