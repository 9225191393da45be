"""Build the self-contained demo target: a git repo with the trainer, a lock, wheels, a target config."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Literal

from relaunch.config import Target, Thresholds
from relaunch.errors import ConfigError

Device = Literal["cpu", "cuda"]

TRAINER = Path(__file__).parent / "trainer"
PROJECT = Path(__file__).resolve().parent.parent
GOOD_PINS = {"tinyattn": "1.0.0", "tinyaccel": "1.0.0"}
# Known-good throughput of the demo on a 2-core machine: 28-56 Ktok/s idle, 9 Ktok/s seen under heavy
# load; uncompiled 0.6 Ktok/s idle. The degraded threshold (0.15 x 30000 = 4500) sits between.
DEMO_BASELINE_TOKENS_PER_SECOND = 30_000.0
# The GPU shape (demo/trainer/model.py SHAPES["cuda"]) on one H200, two drafters sharing it, compiled flex_attention
# (torch 2.11): 570-580 Ktok/s steady, 490-750 Ktok/s at the healthy verdicts of the seven scenarios; uncompiled (the
# hacked model's reference path) 10-12 Ktok/s (tests/fixtures/logs/gpu/demo/). The degraded threshold
# (0.5 x 600000 = 300 Ktok/s) sits between.
GPU_BASELINE_TOKENS_PER_SECOND = 600_000.0
CPU_THRESHOLDS = Thresholds(
    startup_grace_seconds=180,
    poll_interval_seconds=1,
    settle_timeout_seconds=300,
    healthy_steps=5,
    stall_window_floor_seconds=20,
    baseline_tokens_per_second=DEMO_BASELINE_TOKENS_PER_SECOND,
    degraded_ratio=0.15,
)
# Start-up on a GPU: the image's torch and CUDA load, then a cold flex_attention compile if the cache is cold.
GPU_THRESHOLDS = CPU_THRESHOLDS.model_copy(
    update={
        "startup_grace_seconds": 300.0,
        "stall_window_floor_seconds": 30.0,
        "baseline_tokens_per_second": GPU_BASELINE_TOKENS_PER_SECOND,
        "degraded_ratio": 0.5,
    }
)
# Kept in the trainer's and warm-up's environment too (the device machines' rule: no NVLink multicast).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def wheelhouse() -> Path:
    """torch (CPU) and its dependencies as wheels, put there by `make setup`; nothing is downloaded later."""
    path = Path(os.environ.get("RELAUNCH_WHEELHOUSE", PROJECT / ".cache" / "wheelhouse"))
    if not any(path.glob("torch-*.whl")):
        raise SystemExit(f"no torch wheel in {path}: run `make setup` first (it fills the wheelhouse once)")
    return path


def base_pins(path: Path) -> dict[str, str]:
    pins = {}
    for wheel in path.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def lock_text(pins: dict[str, str]) -> str:
    return "# known-good pins for the demo trainer\n" + "".join(f"{n}=={v}\n" for n, v in sorted(pins.items()))


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "relaunch demo",
        "GIT_AUTHOR_EMAIL": "demo@relaunch.invalid",
        "GIT_COMMITTER_NAME": "relaunch demo",
        "GIT_COMMITTER_EMAIL": "demo@relaunch.invalid",
    }
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def build_repo(repo: Path, pins: dict[str, str]) -> None:
    repo.mkdir(parents=True)
    for src in TRAINER.glob("*.py"):
        shutil.copy(src, repo / src.name)
    (repo / "requirements.lock").write_text(lock_text(pins))
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "known-good trainer")


def make_target(work: Path, name: str, wheels: Path, base: Path | None, device: Device = "cpu") -> Target:
    """The demo target: on the CPU its venv holds torch from the wheelhouse (`base`); on GPUs torch comes with the image."""
    train = f"python train.py{' --device cuda' if device == 'cuda' else ''} --checkpoint-dir {work / 'checkpoints'} --checkpoint-every 10"
    common = dict(
        name=name,
        repo_dir=str(work / "repo"),
        restore_paths=["model.py", "train.py"],
        venv_dir=str(work / "venv"),
        lock_file="requirements.lock",
        offline=True,
        import_check=["torch", "tinyattn", "model"],
        inductor_cache_dir=str(work / "inductor-cache"),
        launch_command=train,
        checkpoint_dir=str(work / "checkpoints"),
        tmux_session=name,
        log_dir=str(work / "logs"),
        state_dir=str(work / "state"),
        min_free_disk_gb=1.0,
        max_attempts=3,
    )
    env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if device == "cpu":
        return Target(
            **common,
            python=_base_python(),
            find_links=[str(base), str(wheels)],
            warmup_command="python warmup.py",
            env=env,
            thresholds=CPU_THRESHOLDS,
        )
    devices = gpu_devices()
    return Target(
        **common,
        # The interpreter that holds the image's torch (on the H200 machines /opt/torch/.venv/bin/python3).
        python=sys.executable,
        system_site_packages=True,
        find_links=[str(wheels)],
        warmup_command=f"python warmup.py --devices {','.join(devices)}",
        # PYTHONPATH empty: the orchestrator's own packages (Prefect's carried wheels) stay out of the trainer.
        env={**env, "PYTHONPATH": "", **NO_MULTICAST},
        thresholds=GPU_THRESHOLDS.model_copy(update={"expected_gpus": len(devices)}),
    )


def resolve_device(asked: str | None) -> Device:
    """The demo's device: the one asked for, else cuda where torch sees a GPU, else cpu."""
    with warnings.catch_warnings():
        # Imported here only to ask for a GPU: its import-time notes (a missing numpy) are the trainer's business.
        warnings.simplefilter("ignore")
        try:
            import torch
        except ModuleNotFoundError:
            # relaunch itself runs without torch (a host's orchestration needs none); its demo trains a real model.
            raise ConfigError(
                f"the demo trains a real model and needs torch, which {sys.executable} lacks: "
                "pip install 'relaunch[demo]' (or `make setup` in a clone), then run the demo again"
            ) from None

    if asked is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if asked not in ("cpu", "cuda"):
        raise ConfigError(f"--device {asked!r}: choose cpu or cuda")
    if asked == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device cuda: torch {torch.__version__} in {sys.executable} sees no GPU; use --device cpu")
    return asked


def gpu_devices(drafters: int = 2) -> list[str]:
    """The GPUs the demo's drafters use (train.py: drafter i on GPU i mod the count), each warmed once.

    At least cuda:0: where torch sees none, the trainer and its warm-up fail for real, naming the cause.
    """
    import torch

    return [f"cuda:{i}" for i in range(max(1, min(drafters, torch.cuda.device_count())))]


def _base_python() -> str:
    """The interpreter behind this venv: the torch wheel is built for it."""
    return getattr(sys, "_base_executable", sys.executable)
