"""relaunch's whole flow on a multi-rank trainer, as a plain script: the GPU twin of tests/test_multirank.py.

    python3 bench/gpu_multirank/scenario.py OUTDIR [--device cuda] [--scenario killed --scenario hung]

Against demo/trainer/multirank.py under torchrun (2 ranks; nccl on GPUs with --device cuda, gloo on the CPU),
through a temporary Prefect server (prefect_test_harness), on this machine:
- killed: both ranks step, rank 0 writes checkpoints; rank 1 is SIGKILLed (os.kill on its PID, found as a
  child of the torchrun process relaunch recorded); torchrun ends rank 0; then `recover_training`.
- hung: rank 1 sleeps forever in its data loader after step 12 (first launch only) while rank 0 waits for it
  in the collectives, every rank alive; then `recover_training` (stalled -> py-spy stacks, stop, relaunch).
Each writes OUTDIR/SCENARIO_report.json (the Report), SCENARIO_checks.json (what the test asserts, true or
false), the attempts' logs, nvidia-smi's view of the GPUs before and after, and for hung the py-spy dump.
Prints the report JSON; exits 1 if any check is false. bench/gpu_multirank/run.sh drives it on a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
# As tests/conftest.py: a Prefect home of its own, no telemetry; this interpreter's tools (uv) on PATH.
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="relaunch-prefect-"))
os.environ.update(DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ["PATH"] = f"{os.environ['PATH']}{os.pathsep}{Path(sys.executable).parent}"

from relaunch.flows.recover import recover_training  # noqa: E402
from relaunch.records.report import Report  # noqa: E402
from relaunch.tasks.stop import stop  # noqa: E402
from relaunch.testing.faults import reap, wait_for  # noqa: E402
from relaunch.testing.multirank import (  # noqa: E402
    MULTIRANK,
    THRESHOLDS,
    checkpoints,
    multirank_command,
    old_group,
    polled_verdict,
    run_log,
    still_alive,
    told,
    two_ranks_stepping,
)
from relaunch.testing.targets import current, runs, shell_target, step_detail, wait_for_exit  # noqa: E402
from relaunch.vocabulary import Action, Cause, Verdict  # noqa: E402

# Kept in every trainer's environment too (the device machine's rule: no NVLink multicast).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def gpu_apps() -> str:
    if not shutil.which("nvidia-smi"):
        return "no nvidia-smi"
    apps = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout
    gpus = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout
    return f"compute apps:\n{apps}gpus:\n{gpus}"


def make_target(work: Path, name: str, device: str, *extra: str, find_links: list[str] = ()):
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ckpt = work / "ckpt"
    torchrun = Path(sys.executable).parent / "torchrun"
    torchrun = torchrun if torchrun.is_file() else Path(shutil.which("torchrun"))
    t = shell_target(
        work,
        name=name,
        launch_command=multirank_command(ckpt, *extra, device=device, torchrun=torchrun, trainer=MULTIRANK),
        checkpoint_dir=str(ckpt),
        resume_arg="--resume {checkpoint}",
        # The orchestrator's own PYTHONPATH (the carried Prefect wheels) stays out of the trainer.
        env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": "", **NO_MULTICAST},
        thresholds=THRESHOLDS.model_copy(update={"expected_gpus": 2 if device == "cuda" else 0}),
    )
    t.find_links = [*t.find_links, *find_links]
    subprocess.run(["uv", "venv", "-q", "--python", t.python, t.venv_dir], check=True)
    return t, ckpt


def recover(target) -> tuple[Report, float]:
    start = time.monotonic()
    state = recover_training(target, return_state=True)
    report = state.result(raise_on_failure=False)
    assert isinstance(report, Report), f"the flow ended {state.type} without a report: {report!r}"
    return report, time.monotonic() - start


def finish(out: Path, name: str, t, report: Report, seconds: float, checks: dict, extra: dict) -> bool:
    for i, run_id in enumerate(runs(t), 1):
        (out / f"{name}_attempt{i}.log").write_text(run_log(t, run_id))
    # The final stop: the relaunched ranks hold GPU memory; STOP waits until nvidia-smi lists none of them.
    start = time.monotonic()
    stopped = stop.fn(t)
    detail = stopped.detail.model_dump() if hasattr(stopped.detail, "model_dump") else stopped.detail
    extra["final_stop"] = {"seconds": round(time.monotonic() - start, 2), "detail": detail, "gpus_after": gpu_apps()}
    reap(t)
    (out / f"{name}_report.json").write_text(report.model_dump_json(indent=2))
    (out / f"{name}_checks.json").write_text(json.dumps({"recover_seconds": round(seconds, 1), "checks": checks, **extra}, indent=2))
    print(report.model_dump_json(indent=2))
    print(told(report))
    print(json.dumps(checks, indent=2))
    return all(checks.values())


def killed(out: Path, device: str) -> bool:
    t, ckpt = make_target(Path("/tmp/gpu_multirank/killed"), "multirank-killed", device)
    try:
        ranks = two_ranks_stepping(t, ckpt, at_least=2)
        group = old_group(t)
        before = gpu_apps()
        victim = ranks[1]
        os.kill(victim, signal.SIGKILL)
        wait_for_exit(t, 120)
        newest = checkpoints(ckpt)[-1]
        step = int(newest.stem.split("_")[1])
        first_run = runs(t)[0]
        report, seconds = recover(t)
        first = report.attempts[0]
        second = run_log(t, current(t)) if len(runs(t)) == 2 else ""
        checks = {
            "attempt 1 crashed / killed -> relaunch": (first.verdict, first.cause, first.action)
            == (Verdict.CRASHED, Cause.KILLED, Action.RELAUNCH),
            "the evidence names rank 1 and its pid": first.summary.startswith(f"rank 1 (local_rank 1, pid {victim}, host "),
            "died of SIGKILL, not ChildFailedError": "died of SIGKILL" in first.summary and "ChildFailedError" not in first.summary,
            "no process of the old group alive": not still_alive(group),
            "relaunched from the newest checkpoint": step_detail(report, "launch").get("checkpoint") == str(newest),
            "the new run resumed there": f"resumed from {newest} at step {step}" in second and f"step={step + 1} " in second,
            "two runs": runs(t)[0] == first_run and len(runs(t)) == 2,
            "ends healthy": report.ok and report.verdict is Verdict.HEALTHY,
        }
        extra = {
            "ranks": ranks,
            "killed_pid": victim,
            "old_group": sorted(group),
            "newest_checkpoint": str(newest),
            "gpus_before_kill": before,
        }
        return finish(out, "killed", t, report, seconds, checks, extra)
    finally:
        reap(t)


def hung(out: Path, device: str, find_links: list[str]) -> bool:
    work = Path("/tmp/gpu_multirank/hung")
    once = work.parent / "hung-once"
    once.unlink(missing_ok=True)
    t, ckpt = make_target(work, "multirank-hung", device, "--hang-rank 1 --hang-after 12", f"--hang-marker {once}", find_links=find_links)
    try:
        ranks = two_ranks_stepping(t, ckpt, at_least=1)
        wait_for(once.exists, 120, "rank 1 to hang")
        wait_for(lambda: polled_verdict(t) is Verdict.STALLED, 120, "the hung run to look stalled to a poll", interval=0.5)
        group = old_group(t)
        before = gpu_apps()
        alive_before = sorted(still_alive(group))
        report, seconds = recover(t)
        first = report.attempts[0]
        stacks = step_detail(report, "capture_stacks")
        dump = Path(stacks["stacks_file"]).read_text() if stacks.get("stacks_file") else ""
        (out / "hung_stacks.txt").write_text(dump)
        frames = stacks.get("top_frames", [])
        checks = {
            "every rank alive before the recovery": set(ranks.values()) <= set(alive_before),
            "attempt 1 stalled -> dump_stacks_and_relaunch": (first.verdict, first.action) == (Verdict.STALLED, Action.DUMP_AND_RELAUNCH),
            "capture_stacks, stop, launch": [s.step for s in first.steps] == ["capture_stacks", "stop", "launch"],
            "stacks of rank 0 kept": f"py-spy dump --pid {ranks[0]} " in dump,
            "stacks of rank 1 kept (fetch_batch)": f"py-spy dump --pid {ranks[1]} " in dump
            and any("fetch_batch (multirank.py:" in line for line in frames),
            "no process of the old group alive": not still_alive(group),
            "two runs": len(runs(t)) == 2,
            "ends healthy": report.ok and report.verdict is Verdict.HEALTHY,
        }
        extra = {"ranks": ranks, "old_group": sorted(group), "gpus_while_hung": before, "top_frames": frames}
        return finish(out, "hung", t, report, seconds, checks, extra)
    finally:
        reap(t)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--scenario", action="append", choices=["killed", "hung"])
    p.add_argument("--find-links", action="append", default=[], help="where py-spy's wheel is (offline)")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    from prefect.testing.utilities import prefect_test_harness

    ok = True
    with prefect_test_harness(server_startup_timeout=120):
        for name in a.scenario or ["killed", "hung"]:
            start = time.monotonic()
            try:
                passed = killed(a.out, a.device) if name == "killed" else hung(a.out, a.device, a.find_links)
            except Exception as exc:  # noqa: BLE001 - the other scenario still runs; the error is printed and counted
                import traceback

                traceback.print_exc()
                (a.out / f"{name}_error.txt").write_text(f"{type(exc).__name__}: {exc}")
                passed = False
            print(f"== scenario {name}: {'PASS' if passed else 'FAIL'} in {time.monotonic() - start:.1f} s", flush=True)
            ok = ok and passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
