"""recover-training: see why the run died, apply the playbook, check again; bounded, never looping."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.concurrency.sync import concurrency
from prefect.context import FlowRunContext
from prefect.exceptions import ObjectNotFound
from pydantic import Field

from relaunch.config import Target
from relaunch.deciding.decide import decide
from relaunch.deciding.gang import Nodes, gang_label, gang_run_id, indexed, replacement
from relaunch.deciding.history import Night, Storm, night_of, restart_storm
from relaunch.deciding.ledger import GpuFault, Ledger
from relaunch.deciding.playbook import resume_constraints, steps_for
from relaunch.errors import RelaunchError
from relaunch.flows.common import attempt_from, publish, publish_ledger
from relaunch.flows.outcome import conclude, emit, is_fine, tag_flow_run, untagged_tasks
from relaunch.records.goodput import observe, payload_of
from relaunch.records.report import Report
from relaunch.runlayout import new_run_id, utc_stamp
from relaunch.steps import StepRecord
from relaunch.tasks.capture_stacks import capture_stacks
from relaunch.tasks.common import log
from relaunch.tasks.health import HealthResult, check_health
from relaunch.tasks.install_package import install_package
from relaunch.tasks.launch import check_resumable, choose_checkpoint, launch
from relaunch.tasks.leftovers import stop_leftovers
from relaunch.tasks.lock import target_lock
from relaunch.tasks.memory import first_told_pause, recall, remember
from relaunch.tasks.preflight import preflight
from relaunch.tasks.rebuild_venv import build_venv, rebuild_venv
from relaunch.tasks.restore_code import check_restorable, restore_code
from relaunch.tasks.stop import stop
from relaunch.tasks.warm_cache import warm_cache
from relaunch.vocabulary import Action, Step, Verdict


def each(step: Any, nodes: Nodes, *args: Any, **kwargs: Any) -> list[StepRecord]:
    """One step on every node (relaunch.deciding.gang.Nodes): a run of one node runs it in the flow's own thread; a gang
    runs it on all its nodes at once (Prefect task runs in threads) and waits for all, so the next step begins on no
    node before this one ended on every node."""
    if not nodes.gang:
        return [_record(step(node, *args, **kwargs)) for _, node in nodes]
    futures = [(k, step.submit(node, *args, **kwargs)) for k, node in nodes]
    return [_record(f.result()).model_copy(update={"node": nodes.node_of(k)}) for k, f in futures]


def _record(result: StepRecord | tuple[Any, StepRecord]) -> StepRecord:
    """A step's record (the launch returns its detail beside it)."""
    return result[1] if isinstance(result, tuple) else result


@dataclass(frozen=True)
class StepRun:
    """What a runner of one of a recovery's steps is given: the attempt's names, fixed before its first step (a step
    retried after a dropped connection finds what its first try made), and the nodes each step runs on."""

    target: Target
    health: HealthResult
    attempt: int
    stamp: str
    run_id: str
    nodes: Nodes  # the nodes to launch (relaunch.deciding.gang.indexed)
    stopping: Nodes  # those, and every node of the current launch that answers
    before_step: int | None  # resume only from a checkpoint before this step
    refuse: str | None  # never resume from this checkpoint


Runner = Callable[[StepRun], list[StepRecord]]


def _launch(run: StepRun) -> list[StepRecord]:
    # A gang's nodes resume from the one checkpoint node 0's listing gives, and meet at a fresh rendezvous; a run of
    # one chooses inside its launch task, so a retry of the launch chooses again with it.
    launching = indexed(run.target, run_id=run.run_id, nodes=run.nodes.ranks)
    choice = choose_checkpoint(launching.first, run.before_step, run.refuse) if launching.gang else None
    return each(launch, launching, run.attempt, run.before_step, run.refuse, run.run_id, choice)


# The one table of who runs each step of an action (Action.steps): a step with no runner here fails the recovery
# loudly (NoRunner) before anything of its attempt ran; nothing falls through to a launch.
RUNNERS: dict[Step, Runner] = {
    Step.CAPTURE_STACKS: lambda run: _stacks(run.target, run.health),
    Step.BUILD_VENV: lambda run: each(build_venv, run.nodes, stamp=run.stamp),
    Step.STOP: lambda run: each(stop, run.stopping),
    Step.REBUILD_VENV: lambda run: each(rebuild_venv, run.nodes, stamp=run.stamp),
    Step.INSTALL_PACKAGE: lambda run: each(install_package, run.nodes, run.health.diagnosis.package or ""),
    Step.RESTORE_CODE: lambda run: each(restore_code, run.nodes),
    # A cache the trainer died loading is kept aside for a person to look at, never removed (Cause.keeps_cache_aside).
    Step.WARM_CACHE: lambda run: each(
        warm_cache, run.nodes, keep_aside=bool(run.health.diagnosis.cause and run.health.diagnosis.cause.keeps_cache_aside())
    ),
    Step.LAUNCH: _launch,
}
# Steps that are no action's: each has its own caller (preflight and leftovers before the attempts, the rollback after a
# failed one), so no plan of an action may hold them.
OWN_CALLERS = frozenset({Step.PREFLIGHT, Step.STOP_LEFTOVERS, Step.ROLLBACK_VENV})


class NoRunner(LookupError):
    """A step planned for an action that RUNNERS has no runner for: a bug, said before the attempt's first step."""

    def __init__(self, steps: list[Step], action: Action):
        names = ", ".join(s.value for s in steps)
        super().__init__(f"no runner for step {names} of action {action.value} (flows/recover.py RUNNERS): nothing of this attempt ran")


def run_steps(
    target: Target, action: Action, health: HealthResult, attempt: int, members: list[int] | None = None
) -> tuple[list[StepRecord], str | None]:
    """The action's steps, in order, each by its runner (RUNNERS); on a gang, each on every node of `members` (the nodes
    to launch) at once, the stop also on every node of the current launch that answers."""
    planned = steps_for(action, health.snapshot.unfinished_steps)
    missing = [step for step in planned if step not in RUNNERS]
    if missing:
        raise NoRunner(missing, action)
    stamp = utc_stamp()
    run_id = new_run_id(attempt, stamp=stamp)
    nodes = indexed(target, nodes=members)
    running = [n.node for n in health.nodes if n.member and n.diagnosis is not None]
    stopping = indexed(target, nodes=sorted(set(members or []) | set(running)))
    if nodes.gang:
        run_id = gang_run_id(run_id, nodes.ranks)
    before_step, refuse = resume_constraints(health.diagnosis)
    run = StepRun(target, health, attempt, stamp, run_id, nodes, stopping, before_step, refuse)
    steps: list[StepRecord] = []
    for step in planned:
        if step is Step.STOP:
            # Asked before the run is stopped: a repo mid-rebase or mid-merge, or a checkpoint folder the launch would
            # refuse, fails the recovery while the run goes on.
            if Step.RESTORE_CODE in planned:
                for _, node in nodes:
                    check_restorable(node)
            if Step.LAUNCH in planned:
                check_resumable(nodes.first, before_step)
        steps += RUNNERS[step](run)
    return steps, run_id if Step.LAUNCH in planned else None


def _stacks(target: Target, health: HealthResult) -> list[StepRecord]:
    """Every node's stacks, each from its own last snapshot (a node polled by none is skipped; a run of one's is the
    check's snapshot)."""
    members = [n.node for n in health.nodes if n.member and n.node in health.node_snapshots]
    nodes = indexed(target, nodes=members)
    if not nodes.gang:
        return [capture_stacks(nodes.first, health.snapshot)]
    futures = {k: capture_stacks.submit(node, health.node_snapshots[k]) for k, node in nodes}
    return [f.result().model_copy(update={"node": nodes.node_of(k)}) for k, f in futures.items()]


# Why a recovery the watch started leaves a target stopped on purpose (the attempt's `why`).
LEFT_STOPPED = "stopped on purpose: the watch leaves it; `relaunch recover` starts it again"


@flow(name="recover-training", flow_run_name="recover-{target.name}", log_prints=True, persist_result=True)
def recover_training(
    target: Target,
    force: bool = False,
    handed_over: Annotated[
        bool,
        Field(
            description="Started by the watch for a death it saw, not asked for by a person: a target found stopped on "
            "purpose (`relaunch stop`, tmux kill-session) is left stopped, never relaunched."
        ),
    ] = False,
) -> Report:
    """Diagnose the current run, then act on the verdict through the playbook until healthy or out of attempts.

    Ends Completed only when the target ends healthy, starting or finished (named Recovered when it acted); otherwise
    Failed, with the report as the state's data (`state.result(raise_on_failure=False)`) and as the run's artifact;
    named Escalated where a person must act: the playbook escalated, or a refusal (a RelaunchError, then the state's
    data, with the report on it as `exc.report`), which is told like an escalation and never crashes the run.
    The run is renamed by what happened: `recover-NAME: crashed (killed) -> recovered`.
    """
    report = Report(target=target.name, host=gang_label(target), flow="recover-training")
    run_ctx = FlowRunContext.get()
    flow_run = str(run_ctx.flow_run.id) if run_ctx and run_ctx.flow_run else ""
    tag_flow_run(target)
    try:
        report = _locked_recovery(target, force, report, flow_run, handed_over)
    except RelaunchError as exc:
        # A refusal (no checkpoint it may resume from, a preflight problem, another target's state folder, a step the
        # host refused) is an outcome: the report as far as it got, the escalation's event, a Failed state saying
        # what to do, no traceback. The error stays the state's data: a Python caller of the flow still gets it.
        refused(report, exc)
        publish(report)
        announce(target, report)
        return conclude(report, exc)  # type: ignore[return-value]
    announce(target, report)
    return conclude(report)  # type: ignore[return-value]


def refused(report: Report, exc: RelaunchError) -> Report:
    """The report of a run a RelaunchError ended: which error, and what it said (the error keeps the report)."""
    report.refusal = type(exc).__name__
    report.finish(report.message if report.finished_at and report.message else f"{type(exc).__name__}: {exc}")
    exc.report = report  # type: ignore[attr-defined]
    return report


def _locked_recovery(target: Target, force: bool, report: Report, flow_run: str, handed_over: bool = False) -> Report:
    """The recovery inside its preflight, host slot and target lock (a gang with nothing to do takes neither)."""
    with untagged_tasks():
        first = checked(target, 1) if target.nodes else None
        if first is not None and nothing_to_do(target, first, force):
            # A gang that is fine, or whose current launch has a node that cannot be reached with no way to run without
            # it, is neither prepared nor locked: nothing will be done on any node (relaunch.deciding.gang.gang_action).
            report = _recover(target, force, report, flow_run, first, handed_over)
        else:
            # Every node that answers (a node that cannot be reached would fail the preflight; it is left out).
            nodes = indexed(target, nodes=None if first is None else [n.node for n in first.nodes if n.diagnosis is not None])
            # Preflight only reads: it runs before the lock, so bad input creates nothing at all.
            report.preflight += each(preflight, nodes)
            # Server-side: one recovery per host across all workers (a no-op where no limit exists).
            # Host-side: the lock folder, which also holds with no server at all. A gang's nodes are locked in one
            # order (host, then state folder), so two recoveries sharing nodes never each hold a lock the other wants.
            with ExitStack() as held:
                slots: set[str] = set()  # one slot per host: two nodes on one machine take its slot once
                for _, node in sorted(nodes, key=lambda kn: (kn[1].host.label, kn[1].state_path)):
                    if host_limit_name(node) not in slots:
                        slots.add(host_limit_name(node))
                        held.enter_context(host_slot(node))
                    held.enter_context(target_lock(node, flow_run))
                report.preflight += each(stop_leftovers, nodes)
                report = _recover(target, force, report, flow_run, handed_over=handed_over)
    return report


def nothing_to_do(target: Target, health: HealthResult, force: bool) -> bool:
    """A gang that is fine (and no --force), or whose launch lacks a node that cannot be replaced: no node is touched."""
    if health.diagnosis.verdict.is_fine() and not force:
        return True
    members = [n.node for n in health.nodes if n.member]
    lost = any(n.member and n.diagnosis is None for n in health.nodes)
    return lost and replacement(target, health.nodes, members)[0] is None


def announce(target: Target, report: Report) -> None:
    """The recovery's ending as an event an automation can act on."""
    acted = any(a.action not in (Action.NONE, Action.ESCALATE) for a in report.attempts)
    last = report.attempts[-1] if report.attempts else None
    labels = {"cause": report.cause.value if report.cause else None, "attempt": len(report.attempts)}
    if report.refusal == "HostBusy":  # another recovery holds the target: that one tells its ending
        emit("relaunch.recovery.failed", target, report, step_failed=report.refusal, **labels)
    elif report.refusal or (last and last.action is Action.ESCALATE):
        emit("relaunch.recovery.escalated", target, report, refusal=report.refusal, **labels)
    elif report.ok and acted:
        emit("relaunch.recovery.succeeded", target, report, **labels)
    elif not is_fine(report):
        emit("relaunch.recovery.failed", target, report, **labels)


def checked(target: Target, attempt: int) -> HealthResult:
    """A health check, announced as `relaunch.verdict.<verdict>`."""
    return announce_verdict(target, check_health(target), attempt)


def announce_verdict(target: Target, health: HealthResult, attempt: int) -> HealthResult:
    """`relaunch.verdict.<verdict>` about the target, with what the check saw of its step lines (goodput reads it, the
    dead-man alarm waits for it); the same observation, at the same time, goes into the health result for the report."""
    d = health.diagnosis
    # One time for the event and the report: a report read back before the event is stored is not counted twice.
    health.observation = observe(d, health.snapshot, health.progress, datetime.now(UTC))
    if d.verdict is Verdict.PAUSED:
        _tell_pause(target, health)
    emit(
        f"relaunch.verdict.{d.verdict.value}",
        target,
        None,
        cause=d.cause.value if d.cause else None,
        attempt=attempt,
        summary=d.summary[:200],
        facts=payload_of(health.observation),
        occurred=health.observation.at,
    )
    return health


def _tell_pause(target: Target, health: HealthResult) -> None:
    """A person's pause is told once (`relaunch.run.paused`, which the relaunch-run-paused automation notifies), with how
    to resume; later checks of the same paused run only say their verdict. A server that cannot record it tells again."""
    run_id = health.snapshot.run_id or ""
    try:
        first = first_told_pause(target, run_id)
    except Exception as exc:  # noqa: BLE001 - telling twice is better than never
        log().warning("could not read whether the pause of run %s was told (%s: %s): telling it", run_id, type(exc).__name__, exc)
        first = True
    if first:
        d = health.diagnosis
        emit("relaunch.run.paused", target, None, {"summary": d.summary, "evidence": d.evidence[:4]}, run_id=run_id)


def host_slot(target: Target) -> AbstractContextManager[object]:
    """The host's global concurrency slot where the server has that limit (make serve creates it)."""
    try:
        with get_client(sync_client=True) as client:
            client.read_global_concurrency_limit_by_name(host_limit_name(target))
    except ObjectNotFound:
        return nullcontext()
    # A short lease, renewed while held: a killed orchestrator frees the host within a minute.
    # A failed lease renewal (a server restart, a blip) must not cancel a multi-hour recovery mid-step:
    # the slot then lapses within a lease, and the host-side lock still keeps recoveries apart.
    return concurrency(host_limit_name(target), occupy=1, strict=True, lease_duration=60, raise_on_lease_renewal_failure=False)


def host_limit_name(target: Target) -> str:
    """The global concurrency limit that serialises recoveries on one host."""
    return f"relaunch-host-{target.host.hostname}"


def _recover(
    target: Target, force: bool, report: Report, flow_run: str = "", health: HealthResult | None = None, handed_over: bool = False
) -> Report:
    health = health or checked(target, 1)
    verdict = health.diagnosis.verdict
    if verdict is Verdict.STOPPED and handed_over:
        # The playbook relaunches a stopped target on the first attempt as a person's word (`relaunch recover`). A
        # recovery the watch started is no one's word: a person stopped the target after the death the watch saw (or the
        # death was the stop's own), so it stays stopped. Decided before the playbook, whatever it would say.
        return _left_stopped(report, health)
    if verdict.is_fine() and verdict is not Verdict.STOPPED and not force:
        # Nothing will be launched, so nothing the last nights did can change what happens, and a night that needed
        # no recovery neither counts towards a storm nor ends one: two task runs (0.1-0.4 s each) saved on most checks.
        return _attempts(target, force, report, health, None, Ledger(host=target.host.hostname), [], None)
    # What the last nights did is read once, before the first decision: a storm is judged on the first attempt.
    memory = recall(target)
    now = datetime.now(UTC)
    night = night_of(health.diagnosis, health.snapshot.checkpoint, now, flow_run)
    storm = restart_storm(memory.history.nights, night, target.storm_window_hours, target.storm_max_returns)
    faults: list[GpuFault] = []
    try:
        return _attempts(target, force, report, health, storm, memory.ledger, faults, night)
    finally:
        last = report.attempts[-1] if report.attempts else None
        night.ended = last.verdict if last and last.action in (Action.NONE, Action.ESCALATE) else None
        _remember(target, night, faults, now)


def _attempts(
    target: Target,
    force: bool,
    report: Report,
    health: HealthResult,
    storm: Storm | None,
    ledger: Ledger,
    faults: list[GpuFault],
    night: Night | None,
) -> Report:
    history: list = []
    running = target  # as launched: its CUDA_VISIBLE_DEVICES kept off every GPU in the ledger
    for number in range(1, target.max_attempts + 2):
        actions_taken = number - 1
        left = target.max_attempts - actions_taken
        decision = decide(
            target,
            health.diagnosis,
            health.snapshot,
            health.nodes,
            history,
            attempts_left=left,
            force=force and number == 1,
            storm=storm if number == 1 else None,
            ledger=ledger,
            faults=faults,
            running=running,
            at=datetime.now(UTC),
            flow_run=night.flow_run if night else "",
        )
        ledger, action, why, members = decision.ledger, decision.action, decision.why, decision.members
        faults[:] = decision.faults  # the caller's list: _recover remembers this night's faults however the recovery ends
        running = on_gpus(target, decision.visible_gpus)
        attempt = attempt_from(number, health, action, why)
        if number == 1 and night is not None:
            night.action = action
            if storm is not None and action is Action.ESCALATE:
                attempt.evidence += [f"night: {n.line()}" for n in storm.nights]
        report.attempts.append(attempt)
        report.gpus = health.snapshot.gpus
        log().info(
            "attempt %d: %s%s -> %s",
            number,
            health.diagnosis.verdict.value,
            f" ({health.diagnosis.cause.value})" if health.diagnosis.cause else "",
            action.value,
        )
        if action in (Action.NONE, Action.ESCALATE):
            break
        if not history:
            emit(
                "relaunch.recovery.started",
                target,
                None,
                cause=health.diagnosis.cause.value if health.diagnosis.cause else None,
                attempt=number,
                action=action.value,
            )
        history.append(health.diagnosis)
        try:
            attempt.steps, attempt.run_id = run_steps(running, action, health, number, members)
        except RelaunchError as exc:
            # Which attempt, which step, what the host said: recover_training makes it the run's escalated ending.
            report.finish(f"attempt {number} ({action.value}) failed: {exc}")
            report.refusal = type(exc).__name__
            raise
        health = checked(running, number + 1)
    final = report.attempts[-1]
    message = final.why if final.action is Action.ESCALATE else final.summary
    report.finish(message)
    publish(report)
    return report


def _left_stopped(report: Report, health: HealthResult) -> Report:
    """The report of a recovery that acts on nothing: one attempt, its verdict `stopped`, its action `none`. Nothing is
    launched, so no night is recorded (as for a target found fine)."""
    attempt = attempt_from(1, health, Action.NONE, LEFT_STOPPED)
    report.attempts.append(attempt)
    report.gpus = health.snapshot.gpus
    log().info("attempt 1: %s -> %s (handed over by the watch: %s)", health.diagnosis.verdict.value, Action.NONE.value, LEFT_STOPPED)
    report.finish(attempt.summary)
    publish(report)
    return report


def on_gpus(target: Target, visible: list[int] | None) -> Target:
    """The target as it is launched and checked: on these GPUs (CUDA_VISIBLE_DEVICES), or as configured (None)."""
    if visible is None:
        return target
    return target.model_copy(update={"env": {**target.env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, visible))}})


def _remember(target: Target, night: Night, faults: list[GpuFault], at: datetime) -> None:
    """Written back once per recovery, however it ended; a server that cannot take it is logged, not the recovery's end."""
    try:
        memory = remember(target, night, faults, at)
    except Exception as exc:  # noqa: BLE001 - the recovery's own outcome stands; the next night reads one night less
        log().error("could not record this night in Prefect (%s: %s): the next nights will not know of it", type(exc).__name__, exc)
        return
    publish_ledger(memory.ledger)
