"""A run that spans several nodes: each node as a target of its own, and the gang's verdict from all of theirs.

Pure: no I/O. The health check polls every node in parallel (one round trip per node per poll) and hands
each node's diagnosis here; `judge_gang` decides what the run as a whole is, `gang_action` what may be done
about it. docs/multinode.md says it in words.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, Field

from relaunch.config import DEFAULT_STATE_ROOT, Target
from relaunch.diagnosis import Diagnosis
from relaunch.playbook import Action
from relaunch.verdicts import Cause, Verdict

# Worst first: the verdict a gang whose live nodes disagree takes from the nodes that print step lines.
ALIVE_ORDER = (Verdict.STALLED, Verdict.DIVERGED, Verdict.DEGRADED, Verdict.STARTING, Verdict.HEALTHY)


class NodeHealth(BaseModel):
    """One node as the last poll found it."""

    node: int = Field(description="Node rank (its place in the target's `nodes`).")
    host: str = Field(description="The node's host label.")
    diagnosis: Diagnosis | None = Field(None, description="The node's own verdict; None where it could not be reached.")
    unreachable: str | None = Field(None, description="Why the node could not be reached (the transport's error), if it could not.")

    @property
    def name(self) -> str:
        return f"node {self.node} ({self.host})"

    def line(self) -> str:
        """`node 1 (root@10.0.0.2:22): crashed (killed): rank 1 ...`: the node's row as one line."""
        if self.diagnosis is None:
            return f"{self.name}: unknown: cannot be reached: {self.unreachable}"
        d = self.diagnosis
        return f"{self.name}: {d.verdict.value}{f' ({d.cause.value})' if d.cause else ''}: {d.summary}"


def gang_label(target: Target) -> str:
    """The host label of a run of one node; `2 nodes: a, b` for a gang."""
    if not target.nodes:
        return target.host.label
    return f"{len(target.nodes)} nodes: " + ", ".join(n.host.label for n in target.nodes)


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
        overrides = {f: v for f, v in node.model_dump(exclude={"host", "address", "env"}).items() if v is not None}
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


def judge_gang(nodes: list[NodeHealth]) -> Diagnosis:
    """The run's verdict from every node's: a dead rank anywhere is the run's crash (named by node), a node that cannot be
    reached is `unknown` and named (never a reason by itself to stop the others), and live ranks are judged from the
    nodes whose logs carry step lines (rank 0's, as a rule): none stepping is stalled."""
    reached = [n for n in nodes if n.diagnosis is not None]
    gone = [n for n in nodes if n.diagnosis is None]
    others = lambda first: [n.line() for n in nodes if n is not first]  # noqa: E731
    for verdict in (Verdict.UNMANAGED, Verdict.CRASHED):
        hit = [n for n in reached if n.diagnosis and n.diagnosis.verdict is verdict]
        if hit:
            # A node whose ranks failed because a peer went (a lost collective) is the knock-on, not the cause.
            first = next((n for n in hit if n.diagnosis and n.diagnosis.cause is not Cause.DISTRIBUTED_FAILURE), hit[0])
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


def gang_action(action: Action, why: str, nodes: list[NodeHealth]) -> tuple[Action, str]:
    """What the playbook said, unless a node cannot be reached: then nothing is stopped or launched anywhere, and the
    node is named for a person."""
    gone = [n for n in nodes if n.diagnosis is None]
    if not gone or action in (Action.NONE, Action.ESCALATE):
        return action, why
    names = ", ".join(n.name for n in gone)
    return (
        Action.ESCALATE,
        f"{names} cannot be reached ({gone[0].unreachable}): nothing was stopped or launched on any node; bring it back "
        "(or take it out of the target's nodes and the trainer's world), then recover",
    )
