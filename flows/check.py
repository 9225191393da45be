"""check-training: the health check alone; changes nothing on the host."""

from __future__ import annotations

from prefect import flow

from flows.common import attempt_from, publish
from relaunch.config import Target
from relaunch.playbook import remedy
from relaunch.report import Report
from tasks.health import check_health


@flow(name="check-training", flow_run_name="check-{target.name}", log_prints=True)
def check_training(target: Target) -> Report:
    """Poll the trainer until its verdict settles and report it with the action the playbook would take."""
    report = Report(target=target.name, host=target.host.label, flow="check-training")
    health = check_health(target)
    action, why = remedy(health.diagnosis)
    report.attempts.append(attempt_from(1, health, action, f"would do: {why}"))
    report.gpus = health.snapshot.gpus
    report.finish(health.diagnosis.summary)
    publish(report)
    return report
