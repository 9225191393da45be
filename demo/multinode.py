"""`relaunch demo --scenario multi-node`: a two-node gang broken for real and recovered as one (docs/multinode.md).

Two hosts, each in a network namespace of its own with its own sshd, on a network of their own (a bridge) that
gloo and torchrun's c10d rendezvous run over; relaunch reaches them only by SSH, as it reaches any node. The hosts
are relaunch/testing/netns.py's, so this runs from a clone of relaunch, as root (`ip netns add`). The trainer is
demo/trainer/multirank.py under torchrun (`--nnodes 2`, one rank per node) on this venv's torch; each node has its
own repo, venv, logs, cache and state folder, and the checkpoints are shared, as a cluster's storage is.

The gang is launched, steps, and then the rank on the second node is SIGKILLed; `recover-training` finds it
crashed naming node 1 and the rank, stops every node, relaunches both at a fresh rendezvous from the newest
checkpoint, and checks it healthy. On exit, and on Ctrl-C or SIGTERM at any moment, every trainer, sshd and
namespace it made is removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from relaunch import runlayout
from relaunch.config import Host, Node, Target, Thresholds
from relaunch.deciding.gang import gang_run_id, node_targets, working_nodes
from relaunch.plans.stop import plan_stop
from relaunch.runlayout import new_run_id
from relaunch.tasks.health import check_health, collect_snapshot
from relaunch.tasks.launch import launch
from relaunch.vocabulary import Verdict
from relaunch.wire.transport import close_all, run, transport_for

CHECKOUT = Path(__file__).resolve().parent.parent
MULTIRANK = Path(__file__).resolve().parent / "trainer" / "multirank.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
THRESHOLDS = Thresholds(
    startup_grace_seconds=120, poll_interval_seconds=0.3, settle_timeout_seconds=120, healthy_steps=3, stall_window_floor_seconds=5
)


def say(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def gang_command(checkpoints: Path) -> str:
    """torchrun on every node, meeting at node 0 (c10d) on this launch's port; one rank per node."""
    return " ".join(
        [
            str(TORCHRUN),
            "--nnodes $NNODES --nproc-per-node 1",
            "--rdzv-backend c10d --rdzv-endpoint $RDZV_ENDPOINT --rdzv-id $RDZV_ID",
            # Node 0's address is not among its host name's addresses (a namespace): tell torchrun it holds the store,
            # and give each node's agent its own address for the ranks to meet at.
            "--rdzv-conf is_host=$(( NODE_RANK == 0 )) --local-addr $NODE_ADDR",
            str(MULTIRANK),
            f"--checkpoint-dir {checkpoints} --checkpoint-every 5 --step-seconds 0.05",
        ]
    )


def node_like(t: Target, host: Host, **more: Any) -> Node:
    """A node with the folders of a single-host target `t` (its repo, venv, logs, state, cache) on `host`."""
    folders = {f: getattr(t, f) for f in ("repo_dir", "venv_dir", "log_dir", "state_dir", "inductor_cache_dir")}
    return Node.model_validate({**folders, "host": host, **more})


def gang_target(folder: Path, fleet: Any, name: str, extra_find_links: list[str] | None = None) -> Target:
    """A two-node target on `fleet`'s hosts (relaunch/testing/netns.py Fleet, with a LAN): each node its own folders, one checkpoint folder."""
    from relaunch.testing.targets import shell_target  # a small repo with a lock of tiny wheels, per node

    per_node = [shell_target(folder / f"node{k}", name=f"{name}-{k}") for k in range(len(fleet.servers))]
    nodes = [
        node_like(
            t,
            server.ssh_host(connect_timeout_seconds=3.0, command_timeout_seconds=60.0),
            address=host.lan_address,
            env={"GLOO_SOCKET_IFNAME": host.lan_veth or ""},
        )
        for t, server, host in zip(per_node, fleet.servers, fleet.net.hosts, strict=True)
    ]
    ckpt = folder / "ckpt"
    data = per_node[0].model_dump()
    data.update(
        name=name,
        nodes=[n.model_dump() for n in nodes],
        launch_command=gang_command(ckpt),
        checkpoint_dir=str(ckpt),
        resume_arg="--resume {checkpoint}",
        env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
        find_links=[*per_node[0].find_links, *(extra_find_links or [])],
        thresholds=THRESHOLDS.model_dump(),
    )
    return Target.model_validate(data)


def trainer_pid(node: Target) -> int | None:
    """The node's recorded trainer (torchrun) PID, if a run is recorded."""
    current = Path(runlayout.current_file(node.state_path))
    if not current.exists():
        return None
    return int(Path(runlayout.runs_folder(node.state_path), current.read_text().strip(), "pid").read_text().split()[0])


def rank_pids(node: Target) -> list[int]:
    """The node's ranks: processes under its recorded torchrun whose environment carries torchrun's RANK."""
    from relaunch.testing.faults import descendants, environ

    root = trainer_pid(node)
    if root is None:
        return []
    return [pid for pid in descendants(root) if "RANK" in (env := environ(pid)) and "TORCHELASTIC_RUN_ID" in env]


def _requirements() -> str | None:
    """Why the multi-node demo cannot run here, or None."""
    if not (CHECKOUT / "relaunch" / "testing" / "netns.py").is_file():
        return "the multi-node demo runs from a clone of relaunch (it builds its hosts with relaunch/testing/netns.py)"
    if os.geteuid() != 0:
        return "the multi-node demo makes network namespaces: run it as root"
    if shutil.which("ip") is None or not Path("/usr/sbin/sshd").exists():
        return "the multi-node demo needs `ip` and sshd: apt-get install -y iproute2 openssh-server"
    if not TORCHRUN.is_file():
        return f"no torchrun beside {sys.executable}: run `make setup`"
    return None


# The signals the demo got: Python drops a KeyboardInterrupt raised inside a weakref callback or a __del__ ("Exception
# ignored in ..."), so a Ctrl-C that landed there is acted on at the demo's next step all the same.
SIGNALLED: list[int] = []


def _terminate(signum: int, _frame: FrameType | None) -> None:
    SIGNALLED.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def _unless_interrupted() -> None:
    """Go on only if no Ctrl-C or SIGTERM came, even one whose KeyboardInterrupt Python swallowed."""
    if SIGNALLED:
        raise KeyboardInterrupt(f"signal {SIGNALLED[0]}")


@contextmanager
def broken_gang(work: Path) -> Iterator[Target]:
    """Two hosts, a gang launched on them and healthy, then the rank on node 1 killed; everything removed on exit."""
    why = _requirements()
    if why:
        raise SystemExit(f"relaunch demo: {why}")
    from relaunch.testing.netns import fleet_of_hosts

    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    SIGNALLED.clear()
    previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGINT, signal.SIGTERM)}  # SIGTERM as Ctrl-C
    close_all()
    try:
        with fleet_of_hosts(2, work / "hosts", lan=True) as fleet:
            target = gang_target(work, fleet, "relaunch-demo-multi-node")
            nodes = node_targets(target)
            try:
                spaces = ", ".join(f"{h.netns} ({n.host.label})" for h, n in zip(fleet.net.hosts, nodes, strict=True))
                say(f"two hosts in network namespaces: {spaces}; their own network for gloo")
                _launch(target)
                _unless_interrupted()
                victim = rank_pids(nodes[1])
                say(f"killing the rank on node 1 (pid {victim[0]}) with SIGKILL")
                os.kill(victim[0], signal.SIGKILL)
                deadline = time.monotonic() + 60
                while collect_snapshot(nodes[1], wait_seconds=1).exit_code is None and time.monotonic() < deadline:
                    _unless_interrupted()
                _unless_interrupted()
                yield target
            finally:
                for node in node_targets(target):
                    run(transport_for(node.host), plan_stop(node, 10, deliberate=True), check=False)
                close_all()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _launch(target: Target) -> None:
    """The gang as a person starts it: every node at once, one rendezvous; waits until it steps."""
    from relaunch.demo.scenarios import _user_venv

    for node in node_targets(target):
        _user_venv(node, ["tinyjunk==0.1.0"])  # the lock: a venv as built before
    say("launching the gang: torchrun --nnodes 2 on both hosts (c10d rendezvous, gloo)")
    run_id = gang_run_id(new_run_id(0), working_nodes(target))  # the launch names its nodes, as a recovery's does
    for node in node_targets(target, run_id=run_id):
        launch.fn(node, 0, run_id=run_id)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        health = check_health.fn(target)
        if health.diagnosis.verdict is Verdict.HEALTHY:
            say(f"the gang steps: {health.diagnosis.summary}")
            return
        if health.diagnosis.verdict is not Verdict.STARTING:
            raise SystemExit(f"relaunch demo: the gang never stepped: {health.diagnosis.summary}")
    raise SystemExit("relaunch demo: the gang did not step within 180 s")
