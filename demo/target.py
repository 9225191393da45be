"""Build the self-contained demo target: a git repo with the trainer, a lock, wheels, a target config."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from relaunch.config import Target, Thresholds

TRAINER = Path(__file__).parent / "trainer"
PROJECT = Path(__file__).resolve().parent.parent
GOOD_PINS = {"tinyattn": "1.0.0", "tinyaccel": "1.0.0"}
# Known-good throughput of the demo on a 2-core machine: 28-56 Ktok/s idle, 9 Ktok/s seen under heavy
# load; uncompiled 0.6 Ktok/s idle. The degraded threshold (0.15 x 30000 = 4500) sits between.
DEMO_BASELINE_TOKENS_PER_SECOND = 30_000.0


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


def make_target(work: Path, name: str, wheels: Path, base: Path) -> Target:
    return Target(
        name=name,
        repo_dir=str(work / "repo"),
        restore_paths=["model.py", "train.py"],
        venv_dir=str(work / "venv"),
        lock_file="requirements.lock",
        python=_base_python(),
        find_links=[str(base), str(wheels)],
        offline=True,
        import_check=["torch", "tinyattn", "model"],
        inductor_cache_dir=str(work / "inductor-cache"),
        warmup_command="python warmup.py",
        launch_command=f"python train.py --checkpoint-dir {work / 'checkpoints'} --checkpoint-every 10",
        checkpoint_dir=str(work / "checkpoints"),
        tmux_session=name,
        log_dir=str(work / "logs"),
        env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
        min_free_disk_gb=1.0,
        max_attempts=3,
        thresholds=Thresholds(
            startup_grace_seconds=180,
            poll_interval_seconds=1,
            settle_timeout_seconds=300,
            healthy_steps=5,
            stall_window_floor_seconds=20,
            baseline_tokens_per_second=DEMO_BASELINE_TOKENS_PER_SECOND,
            degraded_ratio=0.15,
        ),
    )


def _base_python() -> str:
    """The interpreter behind this venv: the torch wheel is built for it."""
    return getattr(sys, "_base_executable", sys.executable)
