"""A real CUDA hang, found from the progress record and recovered: the GPU half of issue 50, as a plain script.

    python3 bench/gpu_hang/scenario.py OUTDIR [--part check --part recover --part watch]

The trainer multiplies matrices on the GPU and prints a step line every 0.2 s; after step HANG_AFTER (first run only:
a marker file) it launches a kernel that spins for good (`torch.cuda._sleep`) and waits for it (`synchronize`): the
GPU at 100 %, the host thread in one synchronize, no step advancing. The shape of an NCCL hang on one GPU.
- check: `check_health` after the hang began: how long until `stalled`, with the record's reading (GPU spin) and the
  stacks it sampled;
- recover: `recover_training` on it (stalled -> stacks kept, stopped, relaunched) until healthy again;
- watch: a new hanging run under the watch (relaunch.flows.watch.Watch), which hands the hang to recovery by itself:
  hang -> recovery started, and -> healthy.
Writes OUTDIR/hang.json (timings and checks), hang_evidence.txt (what a person reads), hang_stacks.txt (the py-spy
dumps), hang_progress.txt (the record), hang_attempt*.log. Prints hang.json; exits 1 if a check is false.
bench/gpu_hang/run.sh drives it on a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The installed layout (relaunch.tasks, relaunch.flows) where PYTHONPATH gives one (run.sh), else this checkout's.
if not any((Path(p) / "relaunch" / "tasks").exists() for p in sys.path if p):
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="relaunch-prefect-"))
os.environ.update(DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ["PATH"] = f"{os.environ['PATH']}{os.pathsep}{Path(sys.executable).parent}"

from relaunch.config import Thresholds  # noqa: E402
from relaunch.records.report import Report  # noqa: E402
from relaunch.tasks.health import check_health  # noqa: E402
from relaunch.tasks.launch import launch  # noqa: E402
from relaunch.testing.faults import reap, wait_for  # noqa: E402
from relaunch.testing.targets import current, runs, shell_target  # noqa: E402
from relaunch.vocabulary import Action, Verdict  # noqa: E402

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
HANG_AFTER = 15
TRAINER = r"""
import os, time, torch
x = torch.randn(2048, 2048, device="cuda")
marker = os.environ["HANG_MARKER"]
for step in range(1, 1_000_000):
    y = x @ x
    torch.cuda.synchronize()
    print(f"step={step} loss={float(y.norm()) / 1e5:.4f} | (20.0Ktok/s)", flush=True)
    time.sleep(0.2)
    if step == int(os.environ["HANG_AFTER"]) and not os.path.exists(marker):
        open(marker, "w").close()
        torch.cuda._sleep(1 << 45)  # a kernel that spins for hours: the GPU at 100 %, no step ever again
        torch.cuda.synchronize()
"""


def gpus() -> str:
    if not shutil.which("nvidia-smi"):
        return "no nvidia-smi"
    q = ["nvidia-smi", "--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader"]
    return subprocess.run(q, capture_output=True, text=True).stdout


def make_target(work: Path, floor: float):
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t = shell_target(
        work,
        name="gpu-hang",
        launch_command=f"{sys.executable} -u train.py",
        env={"HANG_MARKER": str(work / "hang-once"), "HANG_AFTER": str(HANG_AFTER), "PYTHONPATH": "", **NO_MULTICAST},
        thresholds=Thresholds(
            startup_grace_seconds=120,
            poll_interval_seconds=1,
            settle_timeout_seconds=300,
            healthy_steps=3,
            stall_window_floor_seconds=floor,
            expected_gpus=1,
        ),
    )
    (Path(t.repo_dir) / "train.py").write_text(TRAINER)
    subprocess.run(["git", "-C", t.repo_dir, "add", "train.py"], check=True)
    subprocess.run(["git", "-C", t.repo_dir, "commit", "-qm", "trainer"], check=True)
    subprocess.run(["uv", "venv", "-q", "--python", t.python, t.venv_dir], check=True)
    return t


def run_dir(t) -> Path:
    return Path(t.state_path) / "runs" / current(t)


def log_of(t, run_id: str) -> str:
    return Path((Path(t.state_path) / "runs" / run_id / "log_path").read_text().strip()).read_text()


def hung_at(t, marker: Path) -> float:
    wait_for(marker.exists, 180, "the trainer to start its spinning kernel")
    return time.time()


def check_part(t, marker: Path, out: Path, result: dict) -> None:
    launch.fn(t, 1)
    began = hung_at(t, marker)
    verdicts = []
    while True:
        r = check_health.fn(t)
        verdicts.append((round(time.time() - began, 1), r.diagnosis.verdict.value, r.diagnosis.summary))
        if r.diagnosis.verdict is Verdict.STALLED or time.time() - began > 240:
            break
    d = r.diagnosis
    (out / "hang_evidence.txt").write_text("\n".join([f"{d.verdict.value}: {d.summary}", *d.evidence, "", gpus()]) + "\n")
    (out / "hang_stacks.txt").write_text(r.snapshot.stacks or "(no stacks in the last poll)\n")
    shutil.copy(run_dir(t) / "progress", out / "hang_progress.txt")
    result["check"] = {
        "seconds_from_hang_to_stalled": verdicts[-1][0],
        "window_seconds": t.thresholds.stall_window_floor_seconds,
        "verdicts": verdicts,
        "stack_samples": len(r.progress.stack_samples),
    }
    result["checks"]["check: stalled"] = d.verdict is Verdict.STALLED
    result["checks"]["check: read as a GPU spin with waiting stacks"] = any("spin" in line for line in [d.summary, *d.evidence])


def recover_part(t, out: Path, result: dict) -> None:
    from relaunch.flows.recover import recover_training

    start = time.monotonic()
    report = recover_training(t, return_state=True).result(raise_on_failure=False)
    assert isinstance(report, Report), report
    first = report.attempts[0]
    result["recover"] = {"seconds": round(time.monotonic() - start, 1), "headline": report.headline(), "timeline": report.timeline()}
    result["checks"]["recover: stalled -> dump stacks and relaunch"] = (first.verdict, first.action) == (
        Verdict.STALLED,
        Action.DUMP_AND_RELAUNCH,
    )
    result["checks"]["recover: ends healthy"] = report.ok and report.verdict is Verdict.HEALTHY
    (out / "recover_report.json").write_text(report.model_dump_json(indent=2))


def watch_part(t, marker: Path, out: Path, result: dict) -> None:
    from relaunch.flows.watch import Watch

    marker.unlink(missing_ok=True)
    before = len(runs(t))
    from relaunch.tasks.stop import stop

    stop.fn(t)
    launch.fn(t, 1)
    began = hung_at(t, marker)
    said: list[tuple[float, str]] = []
    watch = Watch([], lambda line: said.append((round(time.time() - began, 1), line)), targets=[t])
    runner = threading.Thread(target=watch.run, args=(2.0,), daemon=True)
    runner.start()
    try:
        wait_for(lambda: any("recover-training starts now" in line for _, line in said), 300, "the watch to hand the hang over")
        started = next(at for at, line in said if "recover-training starts now" in line)
        wait_for(lambda: any("recovery ended" in line for _, line in said), 300, "the recovery to end")
        ended = next(at for at, line in said if "recovery ended" in line)
    finally:
        watch.stopping.set()
        runner.join(timeout=120)
    result["watch"] = {"hang_to_recovery_started_seconds": started, "hang_to_recovery_ended_seconds": ended, "said": said}
    result["checks"]["watch: handed the hang over by itself"] = len(runs(t)) > before + 1
    result["checks"]["watch: within the window plus 5 s"] = started <= t.thresholds.stall_window_floor_seconds + 5


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--part", action="append", choices=["check", "recover", "watch"])
    p.add_argument("--floor", type=float, default=20.0, help="the stall window's floor, seconds")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    from prefect.testing.utilities import prefect_test_harness

    result: dict = {"checks": {}, "gpus_at_start": gpus()}
    t = make_target(Path("/tmp/gpu_hang"), a.floor)
    marker = Path(t.env["HANG_MARKER"])
    try:
        with prefect_test_harness(server_startup_timeout=120):
            for part in a.part or ["check", "recover", "watch"]:
                try:
                    {"check": lambda: check_part(t, marker, a.out, result), "recover": lambda: recover_part(t, a.out, result)}.get(
                        part, lambda: watch_part(t, marker, a.out, result)
                    )()
                except Exception:  # noqa: BLE001 - the other parts still run; the error is kept
                    import traceback

                    result["checks"][f"{part}: ran"] = False
                    result[f"{part}_error"] = traceback.format_exc()
                    print(traceback.format_exc(), file=sys.stderr)
    finally:
        for i, run_id in enumerate(runs(t), 1):
            (a.out / f"hang_attempt{i}.log").write_text(log_of(t, run_id))
        reap(t)
    (a.out / "hang.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
