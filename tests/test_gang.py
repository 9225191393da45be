"""A run that spans two hosts, checked and recovered as one gang (docs/multinode.md).

Two hosts in network namespaces (relaunch/testing/netns.py), each with its own sshd, and a network of their own (the LAN,
10.215.x.0/24) that gloo and torchrun's c10d rendezvous run over; this machine reaches them only by SSH. The
trainer is demo/trainer/multirank.py under torchrun (`--nnodes 2`, one rank per node, c10d rendezvous at node
0's LAN address, gloo). Each node has its own repo, venv, logs, cache and state folder, as separate machines
would; the checkpoint folder is shared, as a cluster's storage is. Every fault is real: a rank SIGKILLed, a
node's links taken down, a rank stuck in its data loader, a package installed by hand into one node's venv.

One gang is shared by the cases, in order (each starts from a healthy gang and leaves one, or says why not):
the venv drift on node 1 is found by the first recovery, which also launches the gang from nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from relaunch import runlayout
from relaunch.config import Target
from relaunch.deciding.gang import node_targets, rendezvous_port
from relaunch.demo.multinode import gang_target, rank_pids, trainer_pid
from relaunch.flows.fleet import check_fleet
from relaunch.flows.recover import recover_training
from relaunch.tasks.health import check_health
from relaunch.testing.faults import MID_STEP, case, environ, reap, start_time, wait_for
from relaunch.testing.multirank import checkpoints, told
from relaunch.testing.netns import Fleet, fleet_of_hosts
from relaunch.testing.sshd import cannot_run_here
from relaunch.testing.targets import current, step_detail, stop_all, wait_for_exit
from relaunch.vocabulary import Action, Step, Verdict
from relaunch.wire.transport import close_all
from tests.test_multirank import recover, started_under, wheelhouse_or_skip

pytestmark = pytest.mark.usefixtures("prefect_harness")

TORCHRUN = Path(sys.executable).parent / "torchrun"


@dataclass
class Gang:
    fleet: Fleet
    target: Target
    folder: Path

    @property
    def ckpt(self) -> Path:
        return self.folder / "ckpt"

    def nodes(self, target: Target | None = None) -> list[Target]:
        return node_targets(target or self.target)

    def trainer(self, k: int) -> int:
        """Node k's recorded trainer (torchrun) PID."""
        pid = trainer_pid(self.nodes()[k])
        assert pid is not None, f"node {k} has no run on record"
        return pid

    def rank_pid(self, k: int) -> int:
        """The PID of node k's rank (torchrun's child carrying RANK)."""
        (pid,) = rank_pids(self.nodes()[k])
        return pid

    def runs(self, k: int) -> list[str]:
        folder = Path(runlayout.runs_folder(self.nodes()[k].state_path))
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.fixture(scope="module")
def gang(tmp_path_factory: pytest.TempPathFactory, prefect_harness) -> Iterator[Gang]:
    """Two hosts, a node each; every trainer and rank of the gang stopped afterwards, failing test or not."""
    if not TORCHRUN.is_file():
        cannot_run_here(f"no torchrun beside {sys.executable}")
    folder = tmp_path_factory.mktemp("gang")
    close_all()
    with fleet_of_hosts(2, folder / "hosts", lan=True) as fleet:
        target = gang_target(folder, fleet, "gangtest", [wheelhouse_or_skip()])  # py-spy, offline
        gang = Gang(fleet, target, folder)
        try:
            yield gang
        finally:
            for i in sorted(fleet.net.gone):
                fleet.up(i)
            try:
                stop_all(*gang.nodes())
            finally:
                for node in gang.nodes():
                    reap(node)
                for pid in started_under(folder):
                    os.kill(pid, signal.SIGKILL)
                close_all()


def healthy(gang: Gang) -> None:
    """The gang running and healthy, one trainer per node (recovered first if an earlier case left it otherwise)."""
    health = check_health.fn(gang.target)
    if health.diagnosis.verdict is not Verdict.HEALTHY:
        report = recover(gang.target)
        assert report.verdict is Verdict.HEALTHY, told(report)


def one_trainer_per_node(gang: Gang) -> None:
    for k in range(2):
        node = gang.nodes()[k]
        live = [
            run
            for run in gang.runs(k)
            if (pid := Path(runlayout.runs_folder(node.state_path), run, "pid")).exists()
            and start_time(int(pid.read_text().split()[0])) == pid.read_text().split()[1]
        ]
        assert live == [current(node)], f"node {k}: live trainers of runs {live}, current {current(node)}"


def drift_by_hand(gang: Gang, k: int) -> None:
    """Node k's venv as a person left it: the lock's package, and one more installed by hand."""
    for j, node in enumerate(gang.nodes()):
        wheels = node.find_links[0]
        subprocess.run(["uv", "venv", "-q", "--python", node.python, node.venv_dir], check=True)
        extra = ["tinyaccel"] if j == k else []
        subprocess.run(
            [
                "uv",
                "pip",
                "install",
                "-q",
                "--offline",
                "--no-index",
                "--find-links",
                wheels,
                "--python",
                f"{node.venv_dir}/bin/python",
                "tinyjunk",
                *extra,
            ],
            check=True,
        )


def test_a_gang_never_launched_gets_its_venv_rebuilt_on_every_node_reporting_node_1s_drift_and_is_launched_healthy(gang: Gang):
    drift_by_hand(gang, 1)
    report = recover(gang.target)
    first = report.attempts[0]
    assert (first.verdict, first.action) == (Verdict.UNKNOWN, Action.FULL_RECOVERY), told(report)
    assert [n.diagnosis.verdict for n in first.nodes if n.diagnosis] == [Verdict.UNKNOWN, Verdict.UNKNOWN], told(report)
    builds = {s.node: s.detail for s in first.steps if s.step is Step.BUILD_VENV}
    assert set(builds) == {0, 1}, told(report)
    assert any("tinyaccel" in line for line in builds[1].old_venv_drift), builds[1]
    assert not any("tinyaccel" in line for line in builds[0].old_venv_drift), builds[0]
    order = [(s.step, s.node) for s in first.steps]
    assert order.index((Step.STOP, 1)) < order.index((Step.LAUNCH, 0)) and order.index((Step.STOP, 0)) < order.index((Step.LAUNCH, 1))
    assert report.verdict is Verdict.HEALTHY and report.ok, told(report)
    assert "## Nodes" in report.markdown() and "| 1 | root@" in report.markdown(), report.markdown()
    one_trainer_per_node(gang)
    env = [environ(gang.trainer(k)) for k in range(2)]
    assert {e["NODE_RANK"] for e in env} == {"0", "1"} and env[0]["MASTER_PORT"] == env[1]["MASTER_PORT"], env


@case(
    MID_STEP,
    "the rank on node 1 of a two-node torchrun gang (c10d rendezvous, gloo over the nodes' own network) SIGKILLed for real",
    "crashed naming node 1 and the rank; every node stopped before any is launched; relaunched on both at a fresh rendezvous from the newest checkpoint; healthy",
)
def test_a_rank_killed_on_node_1_is_a_crash_naming_node_1_and_the_rank_and_the_whole_gang_is_relaunched_healthy(gang: Gang):
    healthy(gang)
    victim, before = gang.rank_pid(1), [gang.runs(k) for k in range(2)]
    old = environ(gang.trainer(1))
    os.kill(victim, signal.SIGKILL)
    wait_for_exit(gang.nodes()[1], 60)  # node 1's torchrun ends on its own
    health = check_health.fn(gang.target)
    d = health.diagnosis
    assert d.verdict is Verdict.CRASHED and d.summary.startswith("node 1 (root@"), (d.summary, d.evidence)
    assert f"pid {victim}" in d.summary and "rank" in d.summary, d.summary

    report = recover(gang.target)
    first = report.attempts[0]
    assert first.verdict is Verdict.CRASHED and first.summary.startswith("node 1 ("), told(report)
    assert first.action is Action.RELAUNCH, told(report)
    steps = [(s.step, s.node) for s in first.steps]
    assert steps[:2] == [(Step.STOP, 0), (Step.STOP, 1)] and sorted(steps[2:]) == [(Step.LAUNCH, 0), (Step.LAUNCH, 1)], told(report)
    assert report.verdict is Verdict.HEALTHY and report.ok, told(report)
    after = [gang.runs(k) for k in range(2)]
    assert all(len(a) == len(b) + 1 for a, b in zip(after, before, strict=True)), (before, after)
    one_trainer_per_node(gang)
    new = [environ(gang.trainer(k)) for k in range(2)]  # torchrun's own (its ranks get the store's port)
    assert new[0]["RDZV_ID"] == new[1]["RDZV_ID"] != old["RDZV_ID"], "every node meets at a fresh rendezvous"
    assert new[0]["MASTER_PORT"] == str(rendezvous_port(gang.target, current(gang.nodes()[0]))), new[0]
    resumed = step_detail(report, "launch").checkpoint
    assert resumed and resumed.startswith(str(gang.ckpt)), told(report)


def test_node_1_taken_off_the_network_is_unknown_for_that_node_and_node_0s_trainer_is_left_running(gang: Gang):
    healthy(gang)
    trainer0 = gang.trainer(0)
    started0 = start_time(trainer0)
    gang.fleet.down(1)
    try:
        health = check_health.fn(gang.target)
        rows = {n.node: n for n in health.nodes}
        assert health.diagnosis.verdict is Verdict.UNKNOWN, (health.diagnosis.summary, health.diagnosis.evidence)
        assert rows[1].diagnosis is None and rows[1].unreachable, rows
        assert health.diagnosis.summary.startswith("node 1 (root@"), health.diagnosis.summary
        report = recover(gang.target)
        last = report.attempts[-1]
        assert last.action is Action.ESCALATE and "node 1 (" in last.why, told(report)
        assert not any(a.steps for a in report.attempts), told(report)
        assert start_time(trainer0) == started0, "node 0's trainer was stopped"
    finally:
        gang.fleet.up(1)
        close_all()


def test_with_min_nodes_a_node_off_the_network_is_left_out_of_a_smaller_relaunch_and_a_full_recovery_brings_it_back(gang: Gang):
    healthy(gang)
    t = gang.target
    smaller = Target.model_validate({**t.model_dump(), "rendezvous": {**t.rendezvous.model_dump(), "min_nodes": 1}})
    gang.fleet.down(1)
    try:
        report = recover(smaller)
        first = report.attempts[0]
        assert (first.verdict, first.action) == (Verdict.UNKNOWN, Action.RELAUNCH), told(report)
        assert "node 1 cannot be reached: relaunched without it on 1 nodes (rendezvous.min_nodes 1)" in first.why, told(report)
        assert [(s.step, s.node) for s in first.steps] == [(Step.STOP, 0), (Step.LAUNCH, 0)], told(report)
        assert report.verdict is Verdict.HEALTHY and report.ok, told(report)
        assert environ(gang.trainer(0))["NNODES"] == "1", "node 0 runs a world of one"
        assert [n.member for n in report.attempts[-1].nodes] == [True, False], told(report)
    finally:
        gang.fleet.up(1)
        close_all()
    state = recover_training(smaller, force=True, return_state=True)
    back = state.result(raise_on_failure=False)
    assert back.attempts[0].action is Action.FULL_RECOVERY and back.verdict is Verdict.HEALTHY, told(back)
    assert {s.node for s in back.attempts[0].steps if s.step is Step.LAUNCH} == {0, 1}, told(back)
    one_trainer_per_node(gang)


def test_a_fleet_check_shows_the_gang_with_a_row_per_node_under_it(gang: Gang):
    healthy(gang)
    fleet = check_fleet(targets=[gang.target], recover=False)
    (row,) = fleet.rows
    assert row.verdict is Verdict.HEALTHY and [n.node for n in row.nodes] == [0, 1], row
    assert [r["target"] for r in fleet.table()] == ["gangtest", "gangtest node 0", "gangtest node 1"], fleet.table()
    assert fleet.table()[2]["host"] == gang.nodes()[1].host.label


@case(
    MID_STEP,
    "the rank on node 1 of a two-node gang stuck in its data loader, node 0's rank waiting for it in the all_reduce",
    "stalled; both nodes' Python stacks kept (py-spy on each node) before any stop; every node stopped, then relaunched; healthy",
)
def test_a_rank_hung_on_node_1_is_stalled_with_both_nodes_stacks_kept_then_the_gang_is_relaunched(gang: Gang):
    healthy(gang)
    once = gang.folder / "hung-once"
    step = max([int(p.stem.split("_")[1]) for p in checkpoints(gang.ckpt)] or [0])
    nodes = list(gang.target.nodes)
    nodes[1] = nodes[1].model_copy(
        update={"env": {**nodes[1].env, "DEMO_HANG_LOCAL_RANK": "0", "DEMO_HANG_AFTER": str(step + 15), "DEMO_HANG_MARKER": str(once)}}
    )
    hung = gang.target.model_copy(update={"nodes": nodes})
    stop_all(*gang.nodes())
    first = recover(hung)
    assert first.verdict is Verdict.HEALTHY, told(first)
    wait_for(once.exists, 90, "the rank on node 1 to hang")
    ranks = [gang.rank_pid(k) for k in range(2)]
    seen: list = []
    try:
        wait_for(
            lambda: seen.append(check_health.fn(hung)) or seen[-1].diagnosis.verdict is Verdict.STALLED,
            60,
            "the hung gang to look stalled",
            interval=0.5,
        )
    except AssertionError as exc:
        last = seen[-1] if seen else None
        said = (
            [(n.node, n.diagnosis.verdict.value, n.diagnosis.summary, n.diagnosis.evidence[:3]) for n in last.nodes if n.diagnosis]
            if last
            else []
        )
        from relaunch.judging.progress import read_progress

        snaps = last.node_snapshots if last else {}
        record = {k: read_progress(v.progress, 20.0, 0.5).evidence for k, v in snaps.items() if v.progress}
        tree = {
            k: [(p.pid, p.comm, p.state, p.cpu_ticks, p.io_bytes) for p in v.progress[-1].processes] for k, v in snaps.items() if v.progress
        }
        raise AssertionError(
            f"{exc}: last {last.diagnosis.summary if last else None}; nodes {said}; record {record}; tree {tree}"
        ) from None

    report = recover(hung)
    attempt = report.attempts[0]
    assert (attempt.verdict, attempt.action) == (Verdict.STALLED, Action.DUMP_AND_RELAUNCH), told(report)
    stacks = {s.node: s.detail for s in attempt.steps if s.step is Step.CAPTURE_STACKS}
    assert set(stacks) == {0, 1} and not any(d.skipped for d in stacks.values()), stacks
    dumps = {k: Path(d.stacks_file).read_text() for k, d in stacks.items()}
    assert f"--pid {ranks[1]}" in dumps[1] and "fetch_batch (" in dumps[1], dumps[1]
    assert f"--pid {ranks[0]}" in dumps[0] and "all_reduce (" in dumps[0], dumps[0]
    order = [s.step for s in attempt.steps]
    assert order.index(Step.STOP) > max(i for i, s in enumerate(order) if s is Step.CAPTURE_STACKS), order
    assert report.verdict is Verdict.HEALTHY and report.ok, told(report)
    one_trainer_per_node(gang)


def test_the_cli_shows_every_nodes_commands_in_a_dry_run_stops_every_node_and_refuses_one_host_commands(gang: Gang):
    import yaml

    healthy(gang)
    path = gang.folder / "gang.yaml"
    path.write_text(yaml.safe_dump(gang.target.model_dump(mode="json", exclude_defaults=True)))
    relaunch = str(Path(sys.executable).parent / "relaunch")
    dry = subprocess.run([relaunch, "recover", "--dry-run", str(path)], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "# ---- node 1" in dry.stdout and f"over ssh to {gang.nodes()[1].host.route}" in dry.stdout, dry.stdout[:2000]
    logs = subprocess.run([relaunch, "logs", str(path)], capture_output=True, text=True, timeout=60)
    assert logs.returncode == 2 and "runs on 2 nodes: `relaunch logs` takes one host" in logs.stderr, logs.stderr
    trainers = [gang.trainer(k) for k in range(2)]
    out = subprocess.run([relaunch, "stop", "--yes", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("node 0 (root@"), (out.stdout, out.stderr)
    assert not [pid for pid in trainers if start_time(pid)], "every node's trainer stopped"
    health = check_health.fn(gang.target)
    assert health.diagnosis.verdict is Verdict.STOPPED and len(health.nodes) == 2, health.diagnosis
