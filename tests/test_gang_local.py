"""A gang of two nodes on this machine (two local "hosts", as two GPU sets of one box would be run): each node its own
folders, tmux session and state; one host, so its Prefect concurrency slot is taken once, not twice (twice would wait
on itself forever)."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

from relaunch.config import Host, Target
from relaunch.deciding.gang import node_targets
from relaunch.demo.multinode import node_like
from relaunch.flows.recover import host_limit_name, recover_training
from relaunch.testing.faults import live_trainers
from relaunch.testing.multirank import told
from relaunch.testing.targets import shell_target, stop_all
from relaunch.vocabulary import Step, Verdict


def test_a_gang_of_two_nodes_on_one_machine_takes_its_hosts_slot_once_and_is_launched_healthy_on_both(tmp_path, prefect_harness):
    host = Host(kind="local", hostname=f"gang-local-{uuid.uuid4().hex[:8]}")  # a slot of its own on the shared server
    per = [shell_target(tmp_path / f"node{k}", name=f"glocal{k}") for k in range(2)]
    nodes = [node_like(t, host, tmux_session=t.tmux_session) for t in per]
    target = Target.model_validate({**per[0].model_dump(), "name": "glocal", "nodes": [n.model_dump() for n in nodes]})
    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=host_limit_name(node_targets(target)[0]), limit=1))
    try:
        pool = ThreadPoolExecutor(1)  # a recovery waiting on its own slot never ends: fail in bounded time
        try:
            state = pool.submit(recover_training, target, return_state=True).result(timeout=120)
        finally:
            pool.shutdown(wait=False)
        report = state.result(raise_on_failure=False)
        assert report.verdict is Verdict.HEALTHY and report.ok, told(report)
        assert {s.node for s in report.attempts[0].steps if s.step is Step.LAUNCH} == {0, 1}, told(report)
        for k, node in enumerate(node_targets(target)):
            assert len(live_trainers(node)) == 1, f"node {k}: {live_trainers(node)}"
            assert node.env.get("NODE_RANK") is None, "only a launch's node targets carry the rendezvous"
    finally:
        stop_all(*node_targets(target))
        with get_client(sync_client=True) as client:
            client.delete_global_concurrency_limit_by_name(host_limit_name(node_targets(target)[0]))
