"""Warm-up efficacy: the demo trainer's first compiled step after relaunch's warm_cache, against an empty cache.

    python bench/warmup_efficacy.py [--device cpu|cuda] [--trials 3] [--workdir DIR]

Builds the known-good demo target (relaunch.demo.scenarios.build_target) and its venv with relaunch's own
rebuild_venv step, then, per trial, runs the same trainer process twice, each `train.py --steps 3` with the
target's environment (two drafter threads calling compiled attention: tinyattn's on the CPU, flex_attention
forward and backward on a GPU):
- cold: TORCHINDUCTOR_CACHE_DIR an empty folder: the first step compiles every kernel;
- warm: right after relaunch's warm_cache step (which moves the cache aside and runs the target's warm-up
  single-threaded into a fresh one), against that cache: the first step loads the kernels.
The trainer prints `first step in X s, Y s after the process started` (X from the drafters' start to the
first step line; Y includes the imports and CUDA's start). Prints one JSON document (bench/record.py keeps it)
and a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _flow_env import ROOT  # noqa: E402,F401 - first: the environment Prefect is imported into

from relaunch.config import Target  # noqa: E402
from relaunch.demo.scenarios import build_target, say  # noqa: E402
from relaunch.demo.target import resolve_device  # noqa: E402
from relaunch.plans.launch import trainer_env  # noqa: E402
from relaunch.tasks.rebuild_venv import rebuild_venv  # noqa: E402
from relaunch.tasks.warm_cache import warm_cache  # noqa: E402
from relaunch.wire.commands import Command, script  # noqa: E402
from relaunch.wire.transport import run, transport_for  # noqa: E402

FIRST_STEP = re.compile(r"first step in (?P<step>[\d.]+) s, (?P<process>[\d.]+) s after the process started")
TRAINER_TIMEOUT_SECONDS = 600


def in_venv(target: Target, text: str, cache_dir: str, extra: dict[str, str] | None = None) -> Command:
    """A command in the target's repo with its venv and environment, as the launch has them, against cache_dir."""
    env = {
        **trainer_env(target),
        **(extra or {}),
        "TORCHINDUCTOR_CACHE_DIR": cache_dir,
        "PATH": f"{target.venv_dir}/bin:/usr/local/bin:/usr/bin:/bin",
    }
    return script(text, label="in the trainer's venv", env=env, cwd=target.repo_dir, timeout_seconds=TRAINER_TIMEOUT_SECONDS)


def first_step(target: Target, cache_dir: str, extra: dict[str, str]) -> dict[str, object]:
    """One trainer process, three steps, against cache_dir: its first step's seconds, its whole wall time, and
    dynamo's own account of the compile (torch._dynamo.utils.compile_times, printed by the trainer)."""
    device = " --device cuda" if "--device cuda" in target.launch_command else ""
    command = in_venv(target, f"python train.py{device} --steps 3 2>&1", cache_dir, {**extra, "DEMO_COMPILE_TIMES": "1"})
    start = time.monotonic()
    # Not checked: the trainer's daemon drafters may abort the interpreter at exit after its last step line.
    out = run(transport_for(target.host), command, check=False).stdout
    wall = time.monotonic() - start
    found = FIRST_STEP.search(out)
    if not found:
        raise SystemExit(f"the trainer printed no first-step line against {cache_dir}:\n{out[-3000:]}")
    return {
        "first_step_seconds": float(found["step"]),
        "process_to_first_step_seconds": float(found["process"]),
        "wall_seconds": round(wall, 2),
        "dynamo_compile_times": out[found.end() :].split("step=1 ", 1)[0].strip().splitlines(),
    }


def environment(device: str) -> dict[str, object]:
    import torch

    info: dict[str, object] = {"torch": torch.__version__, "python": sys.version.split()[0], "device": device}
    if device == "cuda":
        info.update(gpu=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(), cuda=torch.version.cuda)
    return info


def median(rows: list[dict[str, object]], key: str) -> float:
    return round(statistics.median(float(r[key]) for r in rows), 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda where torch sees a GPU")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "relaunch-warmup-efficacy")
    p.add_argument("--trainer-env", action="append", default=[], metavar="KEY=VALUE", help="for the timed trainer runs, cold and warm")
    a = p.parse_args()
    extra = dict(item.split("=", 1) for item in a.trainer_env)
    device = resolve_device(a.device)
    target = build_target(a.workdir, "warmup-efficacy", device)
    from prefect.testing.utilities import prefect_test_harness

    cold_rows, warm_rows, warmups = [], [], []
    with prefect_test_harness(server_startup_timeout=120):
        rebuilt = rebuild_venv.fn(target)
        # One throwaway import: the OS page cache then holds torch's libraries for every timed run alike.
        run(transport_for(target.host), in_venv(target, "python -c 'import model'", str(a.workdir / "prime-cache")))
        for trial in range(1, a.trials + 1):
            cold = first_step(target, str(a.workdir / f"cold-{trial}"), extra)
            warmed = warm_cache.fn(target)
            warm = first_step(target, target.inductor_cache_dir, extra)
            warmups.append({"seconds": round(warmed.seconds, 2), "cache_bytes": warmed.detail.cache_bytes})
            cold_rows.append(cold)
            warm_rows.append(warm)
            say(f"trial {trial}: first step cold {cold['first_step_seconds']:.2f} s, warm {warm['first_step_seconds']:.2f} s")
    cold_s, warm_s = median(cold_rows, "first_step_seconds"), median(warm_rows, "first_step_seconds")
    result = {
        "environment": environment(device),
        "trainer": f"train.py{' --device cuda' if device == 'cuda' else ''} --steps 3 (two drafter threads)",
        "trainer_env": extra,
        "venv_from_image": rebuilt.detail.from_image,
        "trials": a.trials,
        "cold": cold_rows,
        "warm": warm_rows,
        "warm_cache_step": warmups,
        "median_first_step_cold_seconds": cold_s,
        "median_first_step_warm_seconds": warm_s,
        "speedup_first_step": round(cold_s / warm_s, 2),
        "median_process_to_first_step_cold_seconds": median(cold_rows, "process_to_first_step_seconds"),
        "median_process_to_first_step_warm_seconds": median(warm_rows, "process_to_first_step_seconds"),
    }
    print(json.dumps(result, indent=2))
    print(
        f"{device}: first compiled step, median of {a.trials}: empty cache {cold_s:.2f} s, after warm_cache {warm_s:.2f} s "
        f"({result['speedup_first_step']}x); process start to first step {result['median_process_to_first_step_cold_seconds']:.2f} s "
        f"vs {result['median_process_to_first_step_warm_seconds']:.2f} s; warm_cache took {statistics.median(w['seconds'] for w in warmups):.1f} s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
