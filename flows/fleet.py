"""check-fleet: check many targets at once (bounded), then recover the sick ones, one recovery per host at a time.

Checks run in a thread pool of `max_concurrent` task runs; each is one `check_health` (one round trip per
poll). Sick targets (crashed, stalled, degraded, never launched) are grouped by host; hosts are recovered
in parallel, the targets of one host one after the other, each as a `recover-training` subflow. The
subflow itself also takes the host's global concurrency limit (across workers) and the target's lock
folder on the host (across servers), so a fleet run never races a recovery started elsewhere.
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Annotated

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from prefect.states import Failed
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import Field

from relaunch.config import Target
from relaunch.deciding.gang import node_targets
from relaunch.deciding.incidents import Incident, Sick, cut_off, incidents
from relaunch.deciding.playbook import remedy
from relaunch.flows.check import merge_recovery
from relaunch.flows.common import attempt_from, publish_goodput
from relaunch.flows.outcome import emit, name_flow_run, report_of, result_of
from relaunch.flows.recover import announce_verdict, host_limit_name, recover_training
from relaunch.judging.hardware import gpu_indexes_of
from relaunch.records.report import FleetReport, FleetRow, Report
from relaunch.tasks.common import log
from relaunch.tasks.health import HealthResult, check_health


@task(name="recover-host", task_run_name="recover@{host}", cache_policy=NO_CACHE)
def recover_host(host: str, targets: list[Target]) -> list[Report | str]:
    """The sick targets of one host, one recovery after the other; an error is recorded, not raised, so the others still run."""
    out: list[Report | str] = []
    for target in targets:
        try:
            out.append(report_of(recover_training(target, return_state=True)))
        except Exception as exc:  # noqa: BLE001 - one target's failure is a row in the table, not the fleet's end
            log().error("recovery of %s on %s failed: %s", target.name, host, exc)
            out.append(f"{type(exc).__name__}: {exc}")
    return out


@flow(name="check-fleet", flow_run_name="check-fleet", log_prints=True, persist_result=True)
def check_fleet(
    targets: list[Target],
    recover: bool = True,
    max_concurrent: Annotated[int, Field(ge=1, le=256)] = 4,
    settle_timeout_seconds: Annotated[float | None, Field(gt=0)] = None,
    incident_window_minutes: Annotated[float, Field(gt=0)] = 10.0,
    incident_min_hosts: Annotated[int, Field(ge=2)] = 2,
) -> FleetReport:
    """Check every target (at most `max_concurrent` at once); with `recover`, recover the crashed, stalled, degraded and never-launched ones, never two on one host at once.

    The same failure on `incident_min_hosts` hosts or more within `incident_window_minutes` is one incident: one
    `relaunch.fleet.incident` event names the hosts, the first of its targets is recovered, and the others only once
    that one ends healthy (else they are held, and the run ends Failed)."""
    _refuse_duplicates(targets)
    fleet = FleetReport(targets=len(targets), max_concurrent=max_concurrent)
    start = time.monotonic()
    results = _check_all(targets, max_concurrent, settle_timeout_seconds)
    fleet.check_phase_seconds = round(time.monotonic() - start, 3)
    fleet.checks_per_minute = round(60.0 * len(targets) / fleet.check_phase_seconds, 1) if fleet.check_phase_seconds else 0.0

    reports: dict[int, Report] = {}
    rows: dict[int, FleetRow] = {}
    for i, (target, result) in enumerate(zip(targets, results)):
        rows[i], reports[i] = _row_and_report(target, result, recover)

    sick = [i for i, row in rows.items() if row.found is not None and row.found.needs_recovery()]
    unreachable = [i for i, result in enumerate(results) if isinstance(result, BaseException)]
    start = time.monotonic()
    # Found and announced with --check-only too: a person hears of one incident, not of each host.
    candidates = _sick(targets, results, rows, sick + unreachable)
    found = incidents(candidates, incident_window_minutes, incident_min_hosts)
    for incident in found:
        announce_incident(incident, targets)
        fleet.incidents.append(incident.summary())
        for m in incident.members:
            rows[m.index].incident = incident.label
    if recover:
        _recover_after_incidents(targets, sick, cut_off(found, candidates), found, rows, reports, max_concurrent)
    fleet.recovery_phase_seconds = round(time.monotonic() - start, 3)
    fleet.rows = [rows[i] for i in range(len(targets))]
    fleet.reports = [reports[i] for i in range(len(targets))]
    fleet.finished_at = datetime.now(UTC).isoformat(timespec="seconds")
    log().info("%s", fleet.summary())
    _publish(fleet)
    name_flow_run(fleet.headline())
    for report in fleet.reports:
        publish_goodput(report)
    if all(r.verdict is not None and r.verdict.is_fine() for r in fleet.rows):
        return fleet
    sick = [
        f"{r.target}: {r.verdict.value if r.verdict else 'check failed'}" for r in fleet.rows if not (r.verdict and r.verdict.is_fine())
    ]
    message = "; ".join([f"{len(sick)} of {fleet.targets} targets not healthy: {', '.join(sick)}", *fleet.incidents])
    return Failed(message=message[:480], data=fleet)  # type: ignore[return-value]


def fleet_report(
    targets: list[Target], recover: bool = True, max_concurrent: int = 4, settle_timeout_seconds: float | None = None
) -> FleetReport:
    """check-fleet for Python callers: the FleetReport however the run ended (Failed when a target is not fine).

    Calling the flow itself raises on a Failed ending, since the report is that state's data: for the state, call
    `check_fleet(..., return_state=True)` and read `state.result(raise_on_failure=False)`."""
    state = check_fleet(
        targets=targets, recover=recover, max_concurrent=max_concurrent, settle_timeout_seconds=settle_timeout_seconds, return_state=True
    )
    return result_of(state, FleetReport)


def _recover_after_incidents(
    targets: list[Target],
    sick: list[int],
    cut: dict[int, Incident],
    found: list[Incident],
    rows: dict[int, FleetRow],
    reports: dict[int, Report],
    max_concurrent: int,
) -> None:
    """Every sick target not held first (each incident's first among them); an incident's others once its first is
    healthy. Nothing on a host of an unreachable incident (`cut`): its targets are held while it lasts."""
    held = set(cut) | {m.index for incident in found if not incident.unreachable for m in incident.members[1:]}
    _recover_rows(targets, [i for i in sick if i not in held], rows, reports, max_concurrent)
    for i, incident in cut.items():
        rows[i].message = f"held: {targets[i].host.hostname} is part of {incident.summary()}"
        reports[i].message = rows[i].message
    for incident in found:
        if incident.unreachable:
            continue
        first, waiting = incident.members[0], [m.index for m in incident.members[1:] if m.index not in cut]
        if rows[first.index].ok:
            # The one recovered first came back healthy: the shared cause is gone, the others may follow.
            _recover_rows(targets, waiting, rows, reports, max_concurrent)
            continue
        for i in waiting:
            rows[i].message = f"held: {incident.summary()}; {first.target} did not end healthy, so no other recovery was fanned out"
            reports[i].message = rows[i].message


def _recover_rows(
    targets: list[Target], idx: list[int], rows: dict[int, FleetRow], reports: dict[int, Report], max_concurrent: int
) -> None:
    """Recover these targets: hosts in parallel, the targets of one host one after the other."""
    if not idx:
        return
    by_host: dict[str, list[int]] = defaultdict(list)
    for i in idx:
        by_host[host_limit_name(targets[i])].append(i)
    log().info("recovering %d target(s) on %d host(s): %s", len(idx), len(by_host), ", ".join(targets[i].name for i in idx))
    with ThreadPoolTaskRunner(max_workers=min(max_concurrent, len(by_host))) as runner:
        futures = {host: runner.submit(recover_host, {"host": host, "targets": [targets[i] for i in ids]}) for host, ids in by_host.items()}
        for host, future in futures.items():
            for i, outcome in zip(by_host[host], future.result()):
                _apply_recovery(rows[i], reports[i], outcome)


def _sick(targets: list[Target], results: list[HealthResult | BaseException], rows: dict[int, FleetRow], sick: list[int]) -> list[Sick]:
    """The sick and unreachable targets as incidents are found among: each failure dated by its log's last write (the
    check's end else; an unreachable host's row has no verdict)."""
    checked_at = datetime.now(UTC)
    out = []
    for i in sick:
        result, row = results[i], rows[i]
        quiet = result.snapshot.seconds_since_log_write if isinstance(result, HealthResult) else None
        out.append(
            Sick(
                index=i,
                target=targets[i].name,
                host=targets[i].host.hostname,
                verdict=row.found,
                cause=row.cause,
                failed_at=checked_at - timedelta(seconds=quiet or 0.0),
            )
        )
    return out


def announce_incident(incident: Incident, targets: list[Target]) -> None:
    """One event for the incident, naming every host, about the target recovered first (related: the others)."""
    first = targets[incident.members[0].index]
    log().warning("%s", incident.summary())
    emit(
        "relaunch.fleet.incident",
        first,
        None,
        cause=incident.cause.value if incident.cause else None,
        verdict=incident.verdict.value if incident.verdict else incident.label,
        hosts=",".join(incident.hosts),
        targets=",".join(m.target for m in incident.members),
        summary=incident.summary()[:400],
    )


def _refuse_duplicates(targets: list[Target]) -> None:
    """Each run listed once, and no node's GPUs in two targets: every node of a gang counts as a host of its target."""
    seen: dict[tuple[str, str], str] = {}
    gpus: dict[str, list[tuple[str, set[int] | None]]] = defaultdict(list)
    for t in targets:
        for node in node_targets(t):
            key = (node.host.label, node.state_path)
            if key in seen:
                raise ValueError(f"targets {seen[key]!r} and {t.name!r} are the same run ({key[1]} on {key[0]}): list each run once")
            seen[key] = t.name
            if node.thresholds.expected_gpus:
                listed = gpu_indexes_of(node)
                mine = None if listed is None else set(listed)
                for other, theirs in gpus[node.host.label]:
                    if other != t.name and (mine is None or theirs is None or mine & theirs):
                        raise ValueError(
                            f"targets {other!r} and {t.name!r} both use GPUs of {node.host.label} "
                            f"({_gpus_text(theirs)} and {_gpus_text(mine)}): give each its own CUDA_VISIBLE_DEVICES in env"
                        )
                gpus[node.host.label].append((t.name, mine))


def _gpus_text(indexes: set[int] | None) -> str:
    return "all" if indexes is None else ",".join(map(str, sorted(indexes)))


def _check_all(targets: list[Target], max_concurrent: int, settle_timeout_seconds: float | None) -> list[HealthResult | BaseException]:
    if not targets:
        return []
    out: list[HealthResult | BaseException] = []
    with ThreadPoolTaskRunner(max_workers=min(max_concurrent, len(targets))) as runner:
        futures = [runner.submit(check_health, {"target": t, "timeout_seconds": settle_timeout_seconds}) for t in targets]
        for target, future in zip(targets, futures):
            try:
                out.append(announce_verdict(target, future.result(), 1))
            except Exception as exc:  # noqa: BLE001 - an unreachable host is a row, not the end of the fleet check
                out.append(exc)
    return out


def _row_and_report(target: Target, result: HealthResult | BaseException, recover: bool) -> tuple[FleetRow, Report]:
    report = Report(target=target.name, host=target.host.label, flow="check-fleet")
    if isinstance(result, BaseException):
        message = f"check failed: {type(result).__name__}: {result}"
        report.message = message
        return FleetRow(target=target.name, host=target.host.label, message=message), report
    d = result.diagnosis
    action, why, _ = remedy(d)
    acting = recover and d.verdict.needs_recovery()
    report.attempts.append(
        attempt_from(1, result, action, f"recovering through recover-training: {why}" if acting else f"would do: {why}", acted=acting)
    )
    report.gpus = result.snapshot.gpus
    report.finish(d.summary)
    row = FleetRow(
        target=target.name,
        host=target.host.label,
        found=d.verdict,
        cause=d.cause,
        action=action,
        verdict=d.verdict,
        ok=report.ok,
        polls=result.polls,
        check_seconds=result.seconds,
        message=d.summary,
        nodes=result.nodes,
    )
    return row, report


def _apply_recovery(row: FleetRow, report: Report, outcome: Report | str) -> None:
    row.recovered = True
    if isinstance(outcome, str):
        row.ok, row.message = False, f"recovery failed: {outcome}"
        report.message = row.message
        return
    merge_recovery(report, outcome)
    row.verdict, row.ok, row.message = report.verdict, report.ok, report.message
    row.nodes = report.attempts[-1].nodes if report.attempts else row.nodes


def _publish(fleet: FleetReport) -> None:
    if FlowRunContext.get() is None:
        return
    from prefect.artifacts import create_table_artifact

    try:
        create_table_artifact(table=fleet.table(), key="check-fleet", description=fleet.summary()[:500])
    except Exception as exc:  # the report is also returned and logged
        log().warning("could not publish the fleet table: %s", exc)
