"""Step 7: poll until the verdict settles. One round trip per poll; a death ends the wait at once."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

from pydantic import BaseModel, Field

from relaunch.config import Target
from relaunch.deciding.gang import NodeHealth, current_members, judge_gang, node_targets
from relaunch.errors import CommandFailed, StateFolderTaken, TransportError
from relaunch.judging.diagnosis import advance, diagnose
from relaunch.judging.findings import Diagnosis, Progress
from relaunch.judging.hardware import gpu_indexes_of
from relaunch.judging.snapshot import HealthSnapshot
from relaunch.plans.health import parse_snapshot, plan_journal_step, plan_snapshot
from relaunch.records.goodput import Observation
from relaunch.runlayout import new_nonce, state_identity
from relaunch.tasks.adopt import adopt_run
from relaunch.tasks.common import Progress as ProgressArtifact
from relaunch.tasks.common import artifact_key, execute, log, step_task
from relaunch.vocabulary import Verdict

# The progress artifact of a start-up is updated at most this often.
PROGRESS_UPDATE_SECONDS = 5.0


class HealthResult(BaseModel):
    diagnosis: Diagnosis
    snapshot: HealthSnapshot
    polls: int = Field(description="Round trips made.")
    seconds: float = Field(description="Time spent waiting for the verdict to settle.")
    progress: Progress = Field(default_factory=Progress, description="What the polls saw of the step lines (their times since launch).")
    observation: Observation | None = Field(None, description="The verdict as goodput reads it (set where it is announced).")
    nodes: list[NodeHealth] = Field(default_factory=list, description="A run of several nodes: each node's verdict (empty: one node).")
    node_snapshots: dict[int, HealthSnapshot] = Field(
        default_factory=dict, description="A run of several nodes: each reachable node's last snapshot, by node rank."
    )


def collect_snapshot(
    target: Target,
    wait_seconds: float = 0,
    wake_on_log_write: bool = False,
    seen: Diagnosis | None = None,
    seen_in: HealthSnapshot | None = None,
    wake_floor_seconds: float = 0.2,
    progress_wake_floor_seconds: float | None = None,
) -> HealthSnapshot:
    """One poll. `seen`/`seen_in`: the previous poll's verdict and snapshot, whose step this poll journals on the host
    (RUN/journal) and whose wish for stacks it honours."""
    nonce = new_nonce()
    step = seen.metrics.last_step if seen else None
    at = seen_in.host_now_epoch if seen_in else None
    command = plan_snapshot(
        target,
        wait_seconds,
        nonce,
        wake_on_log_write=wake_on_log_write,
        seen_step=(at, step) if at is not None and step is not None else None,
        want_stacks=bool(seen and seen.want_stacks),
        wake_floor_seconds=wake_floor_seconds,
        progress_wake_floor_seconds=progress_wake_floor_seconds,
    )
    snap = parse_snapshot(execute(target, command).stdout, target.host.label, nonce)
    if snap.state_owner:
        raise StateFolderTaken(target.host.label, target.state_path, snap.state_owner, state_identity(target))
    return snap


def journal_last_step(target: Target, seen: Diagnosis, seen_in: HealthSnapshot) -> None:
    """Leave the step the check's last poll read in the run's journal (each poll journals only its previous poll's),
    so that the next check judges the stall window from the step interval this one saw. Best effort: a host that drops
    now keeps its verdict; the next check then judges from less history, which only watches longer."""
    step, at = seen.metrics.last_step, seen_in.host_now_epoch
    if step is None or at is None or not seen_in.run_id or not seen_in.pid_alive:
        return
    try:
        execute(target, plan_journal_step(target, seen_in.run_id, (at, step)))
    except (CommandFailed, TransportError) as exc:
        log().warning("%s: the last step read (%s) was not journaled: %s", target.name, step, str(exc).splitlines()[0])


def poll_until_settled(target: Target, timeout_seconds: float | None = None) -> HealthResult:
    """Poll every node of the target (one host is a gang of one) with a long-poll wait on each host, in parallel, one
    round trip each per poll (a node's poll returns the moment its trainer dies); return the first settled verdict (or
    `starting` at the timeout). One host's verdict is its own; a gang's is relaunch.deciding.gang.judge_gang of the nodes of its
    current launch (spares and nodes left out are listed, not judged), and a node that cannot be reached is said, not
    retried (one host that cannot be reached is the check's error).

    A run a person started in one host's session, with a log found and no live trainer of relaunch's beside it, is
    adopted first (recorded as the current run, nothing signalled) and then judged as relaunch's own; on a node of a
    gang it is not adopted (the node says unmanaged): a gang's ranks are launched together or not at all."""
    t = target.thresholds
    gang = bool(target.nodes)
    nodes = node_targets(target)
    deadline = time.monotonic() + (timeout_seconds if timeout_seconds is not None else t.settle_timeout_seconds)
    start, polls, last = time.monotonic(), 0, None
    progress = [Progress() for _ in nodes]
    previous: dict[int, tuple[Diagnosis, HealthSnapshot]] = {}
    # Created at the first `starting` verdict: a check that settles at once (most of them) makes no API call for it.
    bar: ProgressArtifact | None = None
    bar_updated = float("-inf")  # the first start-up poll shows at once
    asked_to_adopt = gang  # once per check, and never on a gang's node

    def poll(k: int, wait: float) -> tuple[NodeHealth, HealthSnapshot | None]:
        node = nodes[k]
        seen = previous.get(k, (None, None))
        starting = seen[0] is not None and seen[0].verdict is Verdict.STARTING
        try:
            snap = collect_snapshot(node, wait, starting, *seen, wake_floor(progress[k]), PROGRESS_WAKE_FLOOR_SECONDS)
        except TransportError as exc:
            if not gang:
                raise  # one host that cannot be reached: the check's error, with the host, the command and what to do
            return NodeHealth(node=k, host=node.host.label, unreachable=str(exc).splitlines()[0]), None
        return NodeHealth(node=k, host=node.host.label, run_id=snap.run_id), snap

    def judged(k: int, row: NodeHealth, snap: HealthSnapshot) -> NodeHealth:
        node = nodes[k]
        progress[k] = advance(progress[k], snap, t)
        d = diagnose(snap, t, progress[k], min_free_disk_gb=node.min_free_disk_gb, gpu_indexes=gpu_indexes_of(node, snap))
        previous[k] = (d, snap)
        return row.model_copy(update={"diagnosis": d})

    # A pool only for a gang: one host is polled in the flow's own thread (its task-run logger, no thread to start).
    with ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="relaunch-node-poll") if gang else nullcontext() as pool:
        each = pool.map if pool is not None else map
        wait = 0.0  # the first poll, and the first after an adoption, waits for nothing
        while True:
            found = list(each(poll, range(len(nodes)), [wait] * len(nodes)))
            wait = min(t.poll_interval_seconds, max(0.0, deadline - time.monotonic()))
            polls += 1
            if not asked_to_adopt and found[0][1] is not None and adoptable(found[0][1]):
                # Once per check: a refused adoption (another target's state folder, a trainer of ours alive
                # elsewhere) is judged as it stands, which says UNMANAGED and stops nothing.
                asked_to_adopt = True
                if adopt_foreign(target):
                    progress, last, wait = [Progress()], None, 0.0
                    previous.clear()
                    continue
            rows = [judged(k, row, snap) if snap is not None else row for k, (row, snap) in enumerate(found)]
            snaps = {row.node: snap for row, snap in found if snap is not None}
            if gang:
                members = current_members(target, rows)
                rows = [row.model_copy(update={"member": row.node in members}) for row in rows]
                diagnosis = judge_gang(rows)
                # A node still watched (its history shorter than the stall window, its stacks being sampled) keeps the
                # gang's poll going: the gang is not judged on one look of any node.
                watched = next((r.diagnosis.watching for r in rows if r.member and r.diagnosis and r.diagnosis.watching), None)
                if watched and diagnosis.settled:
                    diagnosis = diagnosis.model_copy(update={"watching": watched})
            else:
                diagnosis = previous[0][0]
            if last is None or diagnosis.verdict is not last:
                log().info("%s: %s (%s)", target.name, diagnosis.verdict.value, diagnosis.summary)
                last = diagnosis.verdict
            first = next(iter(snaps.values()), None) or HealthSnapshot(host=nodes[0].host.label, launched=False)
            if diagnosis.verdict is Verdict.STARTING and time.monotonic() - bar_updated >= PROGRESS_UPDATE_SECONDS:
                # One API round trip per update: a few a minute are enough for a start-up that takes minutes.
                bar_updated = time.monotonic()
                bar = bar or ProgressArtifact(artifact_key(target.name, "health"), "waiting for the verdict to settle")
                elapsed = first.seconds_since_launch or 0.0
                bar.update(min(99.0, 100.0 * elapsed / max(t.startup_grace_seconds, 1.0)), diagnosis.summary, announce=False)
            if diagnosis.settled or time.monotonic() >= deadline:
                list(each(lambda k: journal_last_step(nodes[k], *previous[k]), [k for k in previous if k in snaps]))
                result = HealthResult(
                    diagnosis=diagnosis,
                    snapshot=first,
                    polls=polls,
                    seconds=round(time.monotonic() - start, 3),
                    progress=progress[min(snaps, default=0)],
                )
                if not gang:
                    return result
                unfinished = sorted({s for snap in snaps.values() for s in snap.unfinished_steps})
                return result.model_copy(
                    update={"snapshot": first.model_copy(update={"unfinished_steps": unfinished}), "nodes": rows, "node_snapshots": snaps}
                )


def adoptable(snap: HealthSnapshot) -> bool:
    """A run started by hand in the target's session, whose log was found, and no live trainer of ours beside it."""
    return bool(snap.foreign) and snap.foreign_log is not None and not snap.pid_alive


def adopt_foreign(target: Target) -> bool:
    """Record the session's run as the current one (tasks/adopt.py); False, with the host's reason logged, if refused."""
    try:
        adoption = adopt_run(target)
    except CommandFailed as exc:
        log().warning("%s: the run in tmux session %s was not adopted: %s", target.name, target.tmux_session, exc)
        return False
    log().warning("adopted a run started by hand: pid %s, log %s", adoption.pid, adoption.log_path)
    return True


# How soon a start-up's poll may return at a write that looks like progress (relaunch.plans.health.PROGRESS_WORDS),
# before the first step line too: the first step line is read within this, not up to a poll interval after it.
PROGRESS_WAKE_FLOOR_SECONDS = 0.2


def wake_floor(progress: Progress) -> float:
    """How soon a start-up's poll may return at any write to the log (the poll wakes on it only while `starting`).

    The first write and every write after it may hold the step line that settles the verdict, so the poll does not
    wait out its interval past it. Before the first step line, at most one poll a second for writes that do not look
    like progress: a start-up's loading and compile lines may come many a second for minutes. After it, 0.2 s: the
    next step lines settle the verdict."""
    return 0.2 if progress.last_step is not None else 1.0


@step_task("check_health")
def check_health(target: Target, timeout_seconds: float | None = None) -> HealthResult:
    return poll_until_settled(target, timeout_seconds)
