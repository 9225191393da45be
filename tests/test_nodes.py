"""One host is a gang of one: every step runs on `Nodes` (relaunch.deciding.gang), a run of one as its only node at
rank 0, with no None index anywhere; only its records name no node."""

from __future__ import annotations

from relaunch.config import Host, Target
from relaunch.deciding.gang import indexed
from relaunch.demo.multinode import node_like
from relaunch.flows.recover import each
from relaunch.steps import StepRecord, StopDetail
from relaunch.testing.targets import shell_target
from relaunch.vocabulary import Step


def _step(target: Target) -> StepRecord:
    return StepRecord(step=Step.STOP, seconds=0.0, detail=StopDetail())


_step.submit = None  # a run of one never submits: its step runs in the flow's own thread


def test_a_run_of_one_is_its_own_only_node_at_rank_0_whatever_is_listed_and_its_records_name_no_node(tmp_path):
    target = shell_target(tmp_path)
    for listed in (None, [], [0], [1, 2]):
        nodes = indexed(target, run_id="r1", nodes=listed)
        assert not nodes.gang and nodes.ranks == [0] and nodes.first is target
    assert [r.node for r in each(_step, indexed(target))] == [None]


def test_a_gangs_nodes_carry_their_ranks_and_its_records_name_each_node(tmp_path):
    host = Host(kind="local", hostname="nodes-test")
    per = [shell_target(tmp_path / f"node{k}", name=f"n{k}") for k in range(3)]
    gang = Target.model_validate({**per[0].model_dump(), "name": "g", "nodes": [node_like(t, host).model_dump() for t in per]})
    nodes = indexed(gang, nodes=[2, 0])
    assert nodes.gang and nodes.ranks == [2, 0] and nodes.first.state_path == per[2].state_path
    assert [nodes.node_of(k) for k in nodes.ranks] == [2, 0]
    assert indexed(gang).ranks == [0, 1, 2]
