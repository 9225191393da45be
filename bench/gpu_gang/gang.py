"""A two-node gang on the GPU machine, recovered through relaunch's whole recover-training flow (issue 24).

The machine has one GPU and no sshd, so its two "nodes" are two local hosts of one box, as two GPU sets of one machine
would be run: each node its own repo, venv (the image's torch seen through system site packages), logs, compile cache,
state folder and tmux session; one checkpoint folder. The trainer is demo/trainer/multirank.py under the image's
torchrun (`--nnodes 2`, one rank per node, c10d rendezvous on 127.0.0.1 at the port relaunch picks per launch), both
ranks on cuda:0, so the process group is gloo over CUDA tensors (NCCL refuses two ranks on one GPU).

The gang is launched as a person would, steps, then the rank on node 1 is SIGKILLed; recover-training must find it
crashed naming node 1 and the rank, stop both nodes before launching either, relaunch both at a fresh rendezvous from
the newest checkpoint and end healthy. Writes OUT/gang.json (verdicts, timeline, seconds) and OUT/logs/ (every
node's logs). Run from the repo root on the GPU machine: python3 bench/gpu_gang/gang.py OUT
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _flow_env import ROOT  # noqa: E402 - first: the environment Prefect is imported into

from relaunch.config import Host, Target  # noqa: E402
from relaunch.deciding.gang import node_targets  # noqa: E402
from relaunch.demo.multinode import THRESHOLDS, _launch, node_like, rank_pids  # noqa: E402
from relaunch.demo.target import NO_MULTICAST  # noqa: E402
from relaunch.flows.recover import recover_training  # noqa: E402
from relaunch.tasks.health import collect_snapshot  # noqa: E402
from relaunch.tasks.stop import stop  # noqa: E402
from relaunch.testing.targets import shell_target  # noqa: E402

TORCHRUN = Path(sys.executable).parent / "torchrun"
MULTIRANK = ROOT / "demo" / "trainer" / "multirank.py"
# GANG_DEVICE=cpu: the same run on a machine without a GPU (how this script is tried before a device call).
DEVICE = os.environ.get("GANG_DEVICE", "cuda")


def gang(work: Path) -> Target:
    per = [shell_target(work / f"node{k}", name=f"gpugang{k}") for k in range(2)]
    nodes = [node_like(t, Host(kind="local"), address="127.0.0.1", tmux_session=t.tmux_session) for t in per]
    ckpt = work / "ckpt"
    command = " ".join(
        [
            str(TORCHRUN),
            "--nnodes $NNODES --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint $RDZV_ENDPOINT --rdzv-id $RDZV_ID",
            "--rdzv-conf is_host=$(( NODE_RANK == 0 ))",
            f"{MULTIRANK} --device {DEVICE} --backend gloo --checkpoint-dir {ckpt} --checkpoint-every 5 --step-seconds 0.05",
        ]
    )
    data = per[0].model_dump()
    data.update(
        name="gpu-gang",
        nodes=[n.model_dump() for n in nodes],
        python=sys.executable,
        system_site_packages=True,
        import_check=["torch"],
        launch_command=command,
        checkpoint_dir=str(ckpt),
        resume_arg="--resume {checkpoint}",
        # PYTHONPATH empty: the orchestrator's carried Prefect wheels stay out of the trainer.
        env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": "", **NO_MULTICAST},
        thresholds=THRESHOLDS.model_copy(update={"expected_gpus": 1 if DEVICE == "cuda" else 0}).model_dump(),
    )
    return Target.model_validate(data)


def main() -> int:
    out = Path(sys.argv[1])
    work = Path("/tmp/gpu_gang")
    shutil.rmtree(work, ignore_errors=True)
    target = gang(work)
    nodes = node_targets(target)
    result: dict[str, object] = {"torchrun": str(TORCHRUN)}
    t0 = time.monotonic()
    try:
        _launch(target)
        result["launched_healthy_seconds"] = round(time.monotonic() - t0, 1)
        victim = rank_pids(nodes[1])
        os.kill(victim[0], signal.SIGKILL)
        killed = time.monotonic()
        while collect_snapshot(nodes[1], wait_seconds=1).exit_code is None and time.monotonic() - killed < 60:
            pass
        result["killed_rank_pid"] = victim[0]
        t1 = time.monotonic()
        state = recover_training(target, return_state=True)
        report = state.result(raise_on_failure=False)
        result.update(
            recover_seconds=round(time.monotonic() - t1, 1),
            state=state.type.value,
            message=state.message,
            verdict=report.verdict.value if report.verdict else None,
            ok=report.ok,
            attempts=[
                {"verdict": a.verdict.value, "cause": a.cause.value if a.cause else None, "action": a.action.value, "why": a.why}
                for a in report.attempts
            ],
            timeline=report.timeline(),
            nodes=[n.model_dump(mode="json") for n in getattr(report, "nodes", [])],
        )
    finally:
        for node in nodes:
            stop.fn(node)
        for k, node in enumerate(nodes):
            if Path(node.log_dir).exists():
                shutil.copytree(node.log_dir, out / "logs" / f"node{k}", dirs_exist_ok=True)
        (out / "gang.json").write_text(json.dumps(result, indent=1, default=str))
        print(json.dumps(result, indent=1, default=str)[:6000])
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
