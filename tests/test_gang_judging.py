"""A target of several nodes, and the gang's verdict from its nodes' verdicts: pure, no host (tests/test_gang.py runs them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from relaunch.config import Target, load_target
from relaunch.deciding.gang import NodeHealth, current_members, gang_action, gang_run_id, judge_gang, node_targets, rendezvous_port
from relaunch.errors import ConfigError
from relaunch.judging.findings import Diagnosis, Metrics
from relaunch.vocabulary import Action, Cause, Verdict

ROOT = Path(__file__).resolve().parent.parent

GANG = {
    "name": "big",
    "repo_dir": "/root/big",
    "venv_dir": "/root/big/.venv",
    "lock_file": "requirements.lock",
    "log_dir": "/workspace/logs",
    "checkpoint_dir": "/shared/checkpoints",
    "launch_command": "torchrun --nnodes $NNODES --rdzv-backend c10d --rdzv-endpoint $RDZV_ENDPOINT train.py",
    "env": {"OMP_NUM_THREADS": "1"},
    "rendezvous": {"master_port": 29500, "port_range": 10},
    "nodes": [
        {"host": {"kind": "ssh", "hostname": "gpu-a"}, "address": "10.0.0.1"},
        {"host": {"kind": "ssh", "hostname": "gpu-b"}, "venv_dir": "/opt/venv", "env": {"GLOO_SOCKET_IFNAME": "ib0"}},
    ],
}


def test_each_node_is_a_target_of_its_own_with_its_host_its_overrides_and_a_state_folder_of_its_own():
    a, b = node_targets(Target.model_validate(GANG))
    assert (a.host.hostname, b.host.hostname) == ("gpu-a", "gpu-b")
    assert (a.venv_dir, b.venv_dir) == ("/root/big/.venv", "/opt/venv")
    assert (a.state_path, b.state_path) == ("/var/tmp/relaunch/big-node0", "/var/tmp/relaunch/big-node1")
    assert b.env == {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "ib0"} and a.checkpoint_dir == b.checkpoint_dir
    assert not a.nodes and not b.nodes


def test_a_launch_gives_every_node_its_rank_and_the_same_fresh_rendezvous_at_node_0s_address():
    target = Target.model_validate(GANG)
    a, b = node_targets(target, run_id="20261202T150000Z-a1")
    port = rendezvous_port(target, "20261202T150000Z-a1")
    assert 29500 <= port < 29510
    for rank, node in enumerate((a, b)):
        assert node.env["NODE_RANK"] == str(rank) and node.env["NNODES"] == "2"
        assert node.env["MASTER_ADDR"] == "10.0.0.1" and node.env["MASTER_PORT"] == str(port)
        assert node.env["RDZV_ENDPOINT"] == f"10.0.0.1:{port}" and node.env["RDZV_ID"] == "20261202T150000Z-a1"
    assert b.env["NODE_ADDR"] == "gpu-b", "a node without an address is reached at its host's name"
    ports = {rendezvous_port(target, f"20261202T1500{i:02d}Z-a1") for i in range(30)}
    assert len(ports) > 1, "launches meet at different ports"


def test_a_target_without_nodes_is_its_own_only_node():
    single = Target.model_validate({k: v for k, v in GANG.items() if k not in ("nodes", "rendezvous")})
    assert node_targets(single) == [single]


def test_two_nodes_on_one_host_with_one_state_folder_are_refused_naming_both(tmp_path):
    data = {**GANG, "nodes": [{"host": {"kind": "ssh", "hostname": "a"}, "state_dir": "/s"}] * 2}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"nodes 0 and 1 share host root@a:22 and state folder /s"):
        load_target(path)


def test_the_readme_multi_node_target_file_is_a_valid_target():
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    gangs = [yaml.safe_load(b) for b in blocks if "nodes:" in b]
    assert gangs, "README.md shows a multi-node target file"
    for data in gangs:
        assert len(node_targets(Target.model_validate(data))) >= 2


def node(k: int, verdict: Verdict | None, cause: Cause | None = None, summary: str = "", steps: int = 0) -> NodeHealth:
    if verdict is None:
        return NodeHealth(node=k, host=f"root@n{k}:22", unreachable="host unreachable: timed out")
    d = Diagnosis(verdict=verdict, cause=cause, summary=summary or verdict.value, metrics=Metrics(steps_seen=steps))
    return NodeHealth(node=k, host=f"root@n{k}:22", diagnosis=d)


def test_a_rank_killed_on_one_node_is_the_gangs_crash_named_by_that_node_not_by_the_peers_that_lost_it():
    d = judge_gang(
        [
            node(0, Verdict.CRASHED, Cause.DISTRIBUTED_FAILURE, "gloo: connection closed by peer"),
            node(1, Verdict.CRASHED, Cause.KILLED, "rank 1 (local_rank 0, pid 42) died of SIGKILL"),
        ]
    )
    assert (d.verdict, d.cause) == (Verdict.CRASHED, Cause.KILLED)
    assert d.summary == "node 1 (root@n1:22): rank 1 (local_rank 0, pid 42) died of SIGKILL"
    assert any(line.startswith("node 0 (root@n0:22): crashed (distributed_failure)") for line in d.evidence), d.evidence


def test_a_peer_that_exited_1_after_losing_its_collective_is_not_taken_for_the_node_whose_rank_was_killed():
    # As the multi-node demo saw it: node 0's rank raised gloo's "Connection closed by peer" (exit 1, `error`).
    d = judge_gang([node(0, Verdict.CRASHED, Cause.ERROR, "rank 0 exited 1"), node(1, Verdict.CRASHED, Cause.KILLED, "rank 1 died")])
    assert d.summary == "node 1 (root@n1:22): rank 1 died" and d.cause is Cause.KILLED
    both = judge_gang([node(0, Verdict.CRASHED, Cause.ERROR, "a"), node(1, Verdict.CRASHED, Cause.ERROR, "b")])
    assert both.summary.startswith("node 0 "), "a tie goes to the lowest node"


def test_a_dead_node_beside_live_ones_is_a_crash():
    d = judge_gang([node(0, Verdict.HEALTHY, steps=9), node(1, Verdict.CRASHED, Cause.SILENT_EXIT)])
    assert d.verdict is Verdict.CRASHED and d.summary.startswith("node 1 ")


def test_a_node_that_cannot_be_reached_is_unknown_and_never_a_reason_to_stop_the_others():
    d = judge_gang([node(0, Verdict.HEALTHY, steps=9), node(1, None)])
    assert d.verdict is Verdict.UNKNOWN and d.summary == "node 1 (root@n1:22) cannot be reached: host unreachable: timed out"
    rows = [node(0, Verdict.HEALTHY, steps=9), node(1, None)]
    target = Target.model_validate(GANG)
    action, why, _ = gang_action(Action.FULL_RECOVERY, "no trainer on record", rows, target)
    assert action is Action.ESCALATE and why.startswith("node 1 (root@n1:22) cannot be reached") and "nothing was stopped" in why
    assert gang_action(Action.RELAUNCH, "x", [node(0, Verdict.CRASHED), node(1, Verdict.CRASHED)], target) == (Action.RELAUNCH, "x", [0, 1])


def test_live_ranks_are_judged_from_the_nodes_that_print_step_lines():
    assert judge_gang([node(0, Verdict.HEALTHY, steps=9), node(1, Verdict.STARTING)]).verdict is Verdict.HEALTHY
    assert judge_gang([node(0, Verdict.STALLED, steps=9), node(1, Verdict.STARTING)]).verdict is Verdict.STALLED
    assert judge_gang([node(0, Verdict.STARTING), node(1, Verdict.STARTING)]).verdict is Verdict.STARTING


def test_a_gang_with_no_trainer_on_one_node_is_launched_again_as_a_whole():
    d = judge_gang([node(0, Verdict.HEALTHY, steps=9), node(1, Verdict.UNKNOWN, summary="no trainer on record")])
    assert d.verdict is Verdict.UNKNOWN and d.summary.startswith("node 1 (root@n1:22) has no trainer")
    assert judge_gang([node(0, Verdict.FINISHED), node(1, Verdict.FINISHED)]).verdict is Verdict.FINISHED


def test_the_fleet_table_has_a_row_per_node_under_a_gang():
    from relaunch.records.report import FleetReport, FleetRow

    fleet = FleetReport(
        rows=[
            FleetRow(target="big", host="2 nodes", found=Verdict.UNKNOWN, nodes=[node(0, Verdict.HEALTHY, steps=9), node(1, None)]),
            FleetRow(target="solo", host="local", found=Verdict.HEALTHY),
        ]
    )
    table = fleet.table()
    assert [r["target"] for r in table] == ["big", "big node 0", "big node 1", "solo"]
    assert table[2]["verdict"] == "unknown" and table[2]["message"] == "cannot be reached: host unreachable: timed out"
    assert all(r.keys() == table[0].keys() for r in table), "one set of columns"


def test_a_fleet_refuses_two_targets_on_one_nodes_gpus_and_one_node_listed_twice():
    from relaunch.flows.fleet import check_fleet

    on_gpus = {**GANG, "thresholds": {"expected_gpus": 8}}
    other = {**on_gpus, "name": "other", "nodes": [{"host": {"kind": "ssh", "hostname": "gpu-b"}, "state_dir": "/var/tmp/o"}]}
    with pytest.raises(ValueError, match=r"targets 'big' and 'other' both use GPUs of root@gpu-b:22 \(all and all\)"):
        check_fleet.fn(targets=[Target.model_validate(on_gpus), Target.model_validate(other)])
    apart = {**other, "env": {"CUDA_VISIBLE_DEVICES": "0,1"}}
    mine = {**on_gpus, "env": {"CUDA_VISIBLE_DEVICES": "2,3"}}
    twice = {**apart, "nodes": [{"host": {"kind": "ssh", "hostname": "gpu-b"}, "state_dir": "/var/tmp/relaunch/big-node1"}]}
    with pytest.raises(ValueError, match=r"targets 'big' and 'other' are the same run \(/var/tmp/relaunch/big-node1 on root@gpu-b:22\)"):
        check_fleet.fn(targets=[Target.model_validate(mine), Target.model_validate(twice)])


def spared(**rendezvous: int) -> Target:
    spare = {"host": {"kind": "ssh", "hostname": "gpu-c"}, "spare": True}
    return Target.model_validate({**GANG, "nodes": [*GANG["nodes"], spare], "rendezvous": {**GANG["rendezvous"], **rendezvous}})


def test_a_spare_is_launched_in_place_of_a_node_that_cannot_be_reached_with_its_venv_made_first():
    target = spared()
    rows = [node(0, Verdict.HEALTHY, steps=9), node(1, None), node(2, Verdict.UNKNOWN).model_copy(update={"member": False})]
    action, why, members = gang_action(Action.FULL_RECOVERY, "no trainer", rows, target)
    assert (action, members) == (Action.FULL_RECOVERY, [0, 2]) and why.startswith("node 1 cannot be reached: node 2 (spare) launched"), why
    assert judge_gang(rows).summary.startswith("node 1 "), "a spare that is not launched is not judged"


def test_short_of_spares_a_smaller_world_is_launched_if_min_nodes_allows_else_the_node_is_escalated():
    rows = [node(0, Verdict.HEALTHY, steps=9), node(1, None), node(2, None).model_copy(update={"member": False})]
    action, why, members = gang_action(Action.FULL_RECOVERY, "x", rows, spared(min_nodes=1))
    assert (action, members) == (Action.RELAUNCH, [0]) and "relaunched without it on 1 nodes (rendezvous.min_nodes 1)" in why
    action, why, members = gang_action(Action.FULL_RECOVERY, "x", rows, spared())
    assert action is Action.ESCALATE and "nothing was stopped or launched" in why


def test_the_current_launch_is_the_newest_gang_run_on_record_and_a_full_recovery_brings_the_world_back():
    target = spared(min_nodes=1)
    old, new = gang_run_id("20261202T100000Z-a1", [0, 1]), gang_run_id("20261202T110000Z-a1", [0])
    rows = [
        node(0, Verdict.HEALTHY, steps=9).model_copy(update={"run_id": new}),
        node(1, Verdict.CRASHED).model_copy(update={"run_id": old}),
    ]
    assert current_members(target, rows) == [0]
    rows[1] = rows[1].model_copy(update={"member": False})
    assert judge_gang(rows).verdict is Verdict.HEALTHY, "a node left out of the current launch is listed, not judged"
    assert gang_action(Action.FULL_RECOVERY, "x", rows, target)[2] == [0, 1]
    assert current_members(target, [node(0, Verdict.UNKNOWN), node(1, Verdict.UNKNOWN)]) == [0, 1], "never launched: the working nodes"


def test_a_node_whose_gpu_failed_is_escalated_naming_it_or_replaced_by_a_spare_and_never_taken_back_by_a_full_recovery():
    gpu = node(1, Verdict.CRASHED, Cause.GPU_FAULT, "GPU 3 (0000:9b:00.0) fell off the bus")
    rows = [
        node(0, Verdict.CRASHED, Cause.DISTRIBUTED_FAILURE, "lost its peer"),
        gpu,
        node(2, Verdict.UNKNOWN).model_copy(update={"member": False}),
    ]
    escalated = gang_action(Action.ESCALATE, "a GPU failed", rows, Target.model_validate(GANG))
    assert escalated[0] is Action.ESCALATE and judge_gang(rows).summary.startswith("node 1 (root@n1:22): GPU 3")
    action, why, members = gang_action(Action.ESCALATE, "a GPU failed", rows, spared())
    assert (action, members) == (Action.FULL_RECOVERY, [0, 2]) and why.startswith("node 1 has a GPU fault: node 2 (spare)"), why
    later = [node(0, Verdict.HEALTHY, steps=9), gpu.model_copy(update={"member": False}), node(2, Verdict.HEALTHY)]
    assert gang_action(Action.FULL_RECOVERY, "x", later, spared())[2] == [0, 2], "the node whose GPU failed is not launched again"
    disk = [node(0, Verdict.CRASHED, Cause.DISK_FULL), node(1, None)]
    assert gang_action(Action.ESCALATE, "disk full", disk, spared(min_nodes=1))[0] is Action.ESCALATE, "another escalation stands"


def saved_node(k: int, fixture: str) -> NodeHealth:
    """A node judged from its captured log as the health poll would see its trainer gone with exit code 1."""
    from relaunch.config import Thresholds
    from relaunch.judging.diagnosis import diagnose
    from relaunch.judging.logtext import read_log
    from relaunch.judging.snapshot import HealthSnapshot

    excerpt = read_log(ROOT / "tests" / "fixtures" / "logs" / fixture)
    snap = HealthSnapshot(
        host=f"node{k}",
        launched=True,
        pid_alive=False,
        exit_code=1,
        log_tail=excerpt.tail,
        log_matches=excerpt.matches,
        seconds_since_log_write=1.0,
        log_size_bytes=excerpt.size_bytes,
    )
    return NodeHealth(node=k, host="local", diagnosis=diagnose(snap, Thresholds()))


def test_the_h200_gangs_killed_rank_is_its_crash_named_by_node_1_though_node_0s_torchrun_failed_too():
    # Both nodes' logs of the gang on the H200 (gpu/gang/PROVENANCE.md): torchrun failed on both, node 0's only because
    # gloo lost its peer.
    d = judge_gang([saved_node(0, "gpu/gang/node0_a0.log"), saved_node(1, "gpu/gang/node1_a0.log")])
    assert (d.verdict, d.cause) == (Verdict.CRASHED, Cause.KILLED), (d.summary, d.evidence)
    assert d.summary.startswith("node 1 (local): rank 1 (local_rank 0, pid 1712") and "SIGKILL" in d.summary, d.summary
