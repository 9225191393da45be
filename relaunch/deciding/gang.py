"""A run that spans several nodes: each node as a target of its own, and the gang's verdict from all of theirs.

Pure: no I/O. The health check polls every node in parallel (one round trip per node per poll) and hands
each node's diagnosis here; `judge_gang` decides what the run as a whole is, `gang_action` what may be done
about it. docs/multinode.md says it in words.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import BaseModel, Field

from relaunch.config import DEFAULT_STATE_ROOT, Target
from relaunch.judging.findings import Diagnosis
from relaunch.vocabulary import Action, Cause, Verdict

# Worst first: the verdict a gang whose live nodes disagree takes from the nodes that print step lines.
ALIVE_ORDER = (Verdict.STALLED, Verdict.DIVERGED, Verdict.DEGRADED, Verdict.STARTING, Verdict.HEALTHY)


class NodeHealth(BaseModel):
    """One node as the last poll found it."""

    node: int = Field(description="Node rank (its place in the target's `nodes`).")
    host: str = Field(description="The node's host label.")
    diagnosis: Diagnosis | None = Field(None, description="The node's own verdict; None where it could not be reached.")
    unreachable: str | None = Field(None, description="Why the node could not be reached (the transport's error), if it could not.")
    run_id: str | None = Field(None, description="The node's current run on record (a gang's launch names its nodes in it).")
    member: bool = Field(True, description="Part of the gang's current launch; False: a spare, or a node left out of it.")

    @property
    def name(self) -> str:
        return f"node {self.node} ({self.host})"

    def line(self) -> str:
        """`node 1 (root@10.0.0.2:22): crashed (killed): rank 1 ...`: the node's row as one line."""
        out = "" if self.member else " (not in the current launch)"
        if self.diagnosis is None:
            return f"{self.name}{out}: unknown: cannot be reached: {self.unreachable}"
        d = self.diagnosis
        return f"{self.name}{out}: {d.verdict.value}{f' ({d.cause.value})' if d.cause else ''}: {d.summary}"


def gang_label(target: Target) -> str:
    """The host label of a run of one node; `2 nodes: a, b` for a gang."""
    if not target.nodes:
        return target.host.label
    return f"{len(target.nodes)} nodes: " + ", ".join(n.host.label for n in target.nodes)


MEMBERS = re.compile(r"-nodes(\d+(?:_\d+)*)$")


def gang_run_id(run_id: str, members: list[int]) -> str:
    """A gang's launch names its nodes in its run id (`...-a1-nodes0_2`): every node that has it on record says who launched."""
    return f"{run_id}-nodes{'_'.join(map(str, members))}"


def launched_members(run_id: str | None) -> list[int] | None:
    found = MEMBERS.search(run_id or "")
    return [int(k) for k in found.group(1).split("_")] if found else None


def working_nodes(target: Target) -> list[int]:
    """The nodes launched when nothing says otherwise: every node that is not a spare."""
    return [k for k, n in enumerate(target.nodes) if not n.spare]


def current_members(target: Target, nodes: list[NodeHealth]) -> list[int]:
    """Who the gang's current launch is: the nodes named by the newest gang run id on record on any node that answered
    (run ids begin with their UTC time), else the working nodes."""
    named = sorted((n.run_id for n in nodes if launched_members(n.run_id) is not None), reverse=True)
    members = launched_members(named[0]) if named else None
    return [k for k in members if k < len(target.nodes)] if members else working_nodes(target)


def usable(n: NodeHealth) -> bool:
    """A node that can be launched on: it answers, and its own verdict is no GPU fault (never relaunched onto)."""
    return n.diagnosis is not None and n.diagnosis.cause is not Cause.GPU_FAULT


def why_lost(n: NodeHealth) -> str:
    return "cannot be reached" if n.diagnosis is None else "has a GPU fault"


def replacement(target: Target, nodes: list[NodeHealth], members: list[int]) -> tuple[list[int] | None, str]:
    """The nodes to launch when members are lost (cannot be reached, or a GPU failed): the members left, spares that can
    be launched in place of the others, and, short of spares, a smaller world of at least rendezvous.min_nodes; None
    where neither is possible."""
    ok = {n.node for n in nodes if usable(n)}
    gone = [n for n in nodes if n.node in members and n.node not in ok]
    kept = [k for k in members if k in ok]
    spares = [k for k in range(len(target.nodes)) if k not in members and k in ok and target.nodes[k].spare]
    chosen = sorted(kept + spares[: len(gone)])
    names = ", ".join(f"node {n.node} {why_lost(n)}" for n in gone)
    into = [k for k in chosen if k not in members]
    if len(chosen) == len(members):
        return chosen, f"{names}: {', '.join(f'node {k}' for k in into)} (spare) launched in its place"
    least = target.rendezvous.min_nodes
    if least is not None and len(chosen) >= least:
        extra = f", with spare {', '.join(f'node {k}' for k in into)}" if into else ""
        return chosen, f"{names}: relaunched without it on {len(chosen)} nodes (rendezvous.min_nodes {least}){extra}"
    return None, ""


def rendezvous_port(target: Target, run_id: str) -> int:
    """A port of the target's range, the same for every node of one launch and (almost always) new at the next."""
    r = target.rendezvous
    return r.master_port + int(hashlib.sha256(run_id.encode()).hexdigest(), 16) % r.port_range


def node_address(target: Target, k: int) -> str:
    node = target.nodes[k]
    return node.address or node.host.hostname


def node_targets(target: Target, run_id: str | None = None, nodes: list[int] | None = None) -> list[Target]:
    """Each node (all, or those listed) as a target of its own: its host, its folders, its state folder; with `run_id`
    (a launch), the rendezvous in its environment. A target without nodes is its own only node."""
    if not target.nodes:
        return [target]
    chosen = list(range(len(target.nodes))) if nodes is None else nodes
    base = target.model_dump(exclude={"nodes", "host", "env"})
    out = []
    for k in chosen:
        node = target.nodes[k]
        env = {**target.env, **node.env}
        if run_id is not None:
            env.update(rendezvous_env(target, k, run_id, chosen))
        overrides = {f: v for f, v in node.model_dump(exclude={"host", "address", "env", "spare"}).items() if v is not None}
        out.append(
            Target.model_validate(
                {
                    **base,
                    "name": f"{target.name}-node{k}",
                    "state_dir": node.state_dir or f"{DEFAULT_STATE_ROOT}/{target.name}-node{k}",
                    **overrides,
                    "host": node.host,
                    "env": env,
                }
            )
        )
    return out


@dataclass(frozen=True)
class Nodes:
    """The nodes a step runs on, each with its rank: a gang's (`gang`), or a run of one as its only node, rank 0.

    One kind of thing, as torchelastic's worker group is for one worker: a flow runs a step on `Nodes` whatever their
    number. What differs is said by `gang` alone: a gang's nodes run a step at once (one task run each, its record
    naming its node), a run of one runs it in the flow's own thread and its records name no node."""

    members: tuple[tuple[int, Target], ...]
    gang: bool

    def __iter__(self) -> Iterator[tuple[int, Target]]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    @property
    def ranks(self) -> list[int]:
        return [k for k, _ in self.members]

    @property
    def first(self) -> Target:
        """The first node's target (node 0's, where it is a member): whose listing gives a gang's checkpoint."""
        return self.members[0][1]

    def node_of(self, k: int) -> int | None:
        """What a step's record names as its node: the rank on a gang, none on a run of one."""
        return k if self.gang else None


def indexed(target: Target, run_id: str | None = None, nodes: list[int] | None = None) -> Nodes:
    """node_targets with each node's rank in the target's `nodes`: all of them, or those listed. A run of one node is
    rank 0, its own only node, whatever is listed."""
    if not target.nodes:
        return Nodes(members=((0, target),), gang=False)
    chosen = list(range(len(target.nodes))) if nodes is None else nodes
    return Nodes(members=tuple(zip(chosen, node_targets(target, run_id, chosen), strict=True)), gang=True)


def rendezvous_env(target: Target, k: int, run_id: str, chosen: list[int]) -> dict[str, str]:
    """What launch_command reads on node k of a launch of the nodes `chosen` (node rank: k's place among them)."""
    master, port = node_address(target, chosen[0]), rendezvous_port(target, run_id)
    return {
        "NODE_RANK": str(chosen.index(k)),
        "NNODES": str(len(chosen)),
        "NODE_ADDR": node_address(target, k),
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
        "RDZV_ENDPOINT": f"{master}:{port}",
        "RDZV_ID": run_id.replace(".", "-"),
    }


def judge_gang(everyone: list[NodeHealth]) -> Diagnosis:
    """The run's verdict from its nodes' (those of the current launch; spares and nodes left out are only listed): a dead
    rank anywhere is the run's crash (named by node), a node that cannot be reached is `unknown` and named (never a
    reason by itself to stop the others), and live ranks are judged from the nodes whose logs carry step lines (rank
    0's, as a rule): none stepping is stalled."""
    nodes = [n for n in everyone if n.member]
    reached = [n for n in nodes if n.diagnosis is not None]
    gone = [n for n in nodes if n.diagnosis is None]
    others = lambda first: [n.line() for n in everyone if n is not first]  # noqa: E731
    for verdict in (Verdict.UNMANAGED, Verdict.CRASHED):
        hit = [n for n in reached if n.diagnosis and n.diagnosis.verdict is verdict]
        if hit:
            # A node whose ranks failed because a peer went is the knock-on, not the cause: a lost collective says so
            # (distributed_failure), and so, as a rule, does a plain exit 1 (gloo's "connection closed by peer" raised in
            # the rank) beside a node whose rank was killed or crashed by itself. Ties go to the lowest node.
            first = min(hit, key=lambda n: n.diagnosis.cause.knock_on_rank() if n.diagnosis and n.diagnosis.cause else -1)
            return _named(first, others(first))
    if gone:
        first = gone[0]
        seen = reached[0].diagnosis if reached else None
        return Diagnosis(
            verdict=Verdict.UNKNOWN,
            summary=f"{first.name} cannot be reached: {first.unreachable}",
            evidence=[first.line(), *others(first), "nothing is stopped on the nodes that answer while one cannot be judged"],
            metrics=seen.metrics if seen else Diagnosis(verdict=Verdict.UNKNOWN).metrics,
        )
    diagnoses = [(n, n.diagnosis) for n in reached if n.diagnosis]
    for verdict in (Verdict.STOPPED, Verdict.UNKNOWN, Verdict.FINISHED):
        if all(d.verdict is verdict for _, d in diagnoses):
            return _named(diagnoses[0][0], others(diagnoses[0][0]), prefix=False)
    hit = [n for n, d in diagnoses if d.verdict in (Verdict.UNKNOWN, Verdict.STOPPED)]
    if hit:
        # Part of the gang has no trainer: the rest waits for it forever. Launched again as a whole.
        first = hit[0]
        d = first.diagnosis or Diagnosis(verdict=Verdict.UNKNOWN)
        return Diagnosis(
            verdict=Verdict.UNKNOWN,
            summary=f"{first.name} has no trainer ({d.summary}) while other nodes run",
            evidence=[first.line(), *others(first)],
            metrics=d.metrics,
        )
    alive = [(n, d) for n, d in diagnoses if d.verdict in ALIVE_ORDER]
    stepping = [(n, d) for n, d in alive if d.metrics.steps_seen > 0] or alive[:1]
    first, _ = min(stepping, key=lambda nd: ALIVE_ORDER.index(nd[1].verdict))
    return _named(first, others(first))


def _named(node: NodeHealth, others: list[str], prefix: bool = True) -> Diagnosis:
    d = node.diagnosis
    assert d is not None
    summary = f"{node.name}: {d.summary}" if prefix else d.summary
    return d.model_copy(update={"summary": summary, "evidence": [*d.evidence, *others]})


def gang_action(action: Action, why: str, nodes: list[NodeHealth], target: Target | None = None) -> tuple[Action, str, list[int] | None]:
    """What the playbook said, and the nodes to act on (None: a run of one node). Where a node of the current launch
    cannot be reached, nothing is stopped or launched anywhere and the node is named for a person; a node whose GPU
    failed is escalated naming it (the playbook's gpu_fault). Unless spares or a smaller world (rendezvous.min_nodes)
    let the gang run without the lost node: then it is relaunched without it (a spare joining is given the full
    procedure: its venv, code and cache made first). A full recovery with every working node usable launches the
    working nodes again (a node left out earlier rejoins)."""
    if target is None or not target.nodes:
        return action, why, None
    members = [n.node for n in nodes if n.member] or working_nodes(target)
    lost = [n for n in nodes if n.node in members and not usable(n)]
    ok = {n.node for n in nodes if usable(n)}
    if not lost and action is Action.FULL_RECOVERY and set(working_nodes(target)) <= ok:
        # The full procedure brings the configured world back: a node left out earlier, usable again, rejoins.
        return action, why, working_nodes(target)
    if not lost or action is Action.NONE:
        return action, why, members
    chosen, how = replacement(target, nodes, members)
    # An escalation is overridden only where it is for the lost node's own GPU fault.
    for_lost_gpu = action is Action.ESCALATE and judge_gang(nodes).cause is Cause.GPU_FAULT
    if chosen is not None and (action is not Action.ESCALATE or for_lost_gpu):
        joined = any(k not in members for k in chosen)
        return Action.FULL_RECOVERY if joined else Action.RELAUNCH, f"{how}; {why}", chosen
    gone = [n for n in lost if n.diagnosis is None]
    if not gone:
        return action, why, members
    names = ", ".join(n.name for n in gone)
    return (
        Action.ESCALATE,
        f"{names} cannot be reached ({gone[0].unreachable}): nothing was stopped or launched on any node; bring it back "
        "(or list a spare node, or set rendezvous.min_nodes), then recover",
        members,
    )
