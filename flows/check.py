"""check-training: the health check; with `recover`, hands a sick run to recover-training as a subflow.

A run that is healthy, finished or still starting is only recorded: nothing on the host changes, and
no second trainer is ever started beside a live one (recover-training checks again before it acts).
"""

from __future__ import annotations

from prefect import flow

from relaunch.config import Target
from relaunch.deciding.playbook import remedy
from relaunch.errors import RelaunchError
from relaunch.flows.common import attempt_from, publish, publish_goodput
from relaunch.flows.outcome import conclude, emit, report_of, tag_flow_run, untagged_tasks
from relaunch.flows.recover import checked, recover_training
from relaunch.judging.findings import Diagnosis
from relaunch.records.report import Report


@flow(name="check-training", flow_run_name="check-{target.name}", log_prints=True, persist_result=True)
def check_training(target: Target, recover: bool = False) -> Report:
    """Poll the trainer until its verdict settles and report it; with `recover`, recover a crashed, stalled, degraded or never-launched run.

    Ends Completed only when the target is (or ends) healthy, starting or finished (named Recovered when its
    recovery brought it back); a sick run that was not recovered, or a recovery that gave up, ends Failed with the
    report as the state's data (named Escalated where a person must act; a refusal's error is then the data). The
    run is renamed by what happened: `check-NAME: healthy`, `check-NAME: crashed (killed) -> recovered`.
    """
    report = Report(target=target.name, host=target.host.label, flow="check-training")
    tag_flow_run(target)
    try:
        with untagged_tasks():
            health = checked(target, 1)
    except RelaunchError as exc:
        # The check itself was refused (another target's state folder, a host that cannot be reached): an escalation.
        report.refusal = type(exc).__name__
        report.finish(f"the check failed: {type(exc).__name__}: {exc}")
        publish(report)
        emit("relaunch.recovery.escalated", target, report, refusal=report.refusal, attempt=0)
        return conclude(report, exc)  # type: ignore[return-value]
    action, why, _ = remedy(health.diagnosis)
    verdict = health.diagnosis.verdict
    act = recover and verdict.needs_recovery()
    report.attempts.append(
        attempt_from(1, health, action, f"recovering through recover-training: {why}" if act else f"would do: {why}", acted=act)
    )
    report.gpus = health.snapshot.gpus
    if not act:
        report.finish(not_recovered(health.diagnosis, why, recover))
        publish(report)
        publish_goodput(report)
        return conclude(report)  # type: ignore[return-value]
    try:
        recovery = report_of(recover_training(target, return_state=True))
    except RelaunchError as exc:
        # recover-training ended on a refusal (its event is out, its report on the error): the check ends escalated too.
        if isinstance(getattr(exc, "report", None), Report):
            merge_recovery(report, exc.report)  # type: ignore[attr-defined]
        report.refusal = type(exc).__name__
        report.finish(f"check found {verdict.value}; recover-training refused: {type(exc).__name__}: {exc}")
        publish(report)
        publish_goodput(report)
        return conclude(report, exc)  # type: ignore[return-value]
    merge_recovery(report, recovery)
    publish(report)
    publish_goodput(report)
    return conclude(report)  # type: ignore[return-value]


def not_recovered(diagnosis: Diagnosis, why: str, recover: bool) -> str:
    """The message of a check that changed nothing: the summary alone for a fine run, and for a repo_dir that is not on
    the host (no recovery could launch from it: what to do is the target file's, flows/outcome.py what_to_do); else that
    nothing was done and why, then what a recovery would do."""
    summary = diagnosis.summary
    if diagnosis.verdict.is_fine() or diagnosis.repo_dir_missing:
        return summary
    if not recover:
        return f"{summary}; nothing was done: not asked to recover (run `relaunch recover` or `check --recover`); would do: {why}"
    return f"{summary}; nothing was done: {why}"


def merge_recovery(report: Report, recovery: Report) -> Report:
    """The check's own attempt first, then the recovery's attempts (renumbered after it); verdict from the recovery."""
    first = report.attempts[0]
    offset = len(report.attempts)
    report.attempts += [a.model_copy(update={"number": a.number + offset}) for a in recovery.attempts]
    report.preflight = recovery.preflight
    report.gpus = recovery.gpus or report.gpus
    label = first.verdict.value + (f" ({first.cause.value})" if first.cause else "")
    return report.finish(f"check found {label}; recover-training: {recovery.message}")
