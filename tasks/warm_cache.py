"""Step 5: clear the inductor cache, then warm it single-threaded with the trainer's own environment."""

from __future__ import annotations

from pathlib import PurePosixPath

from relaunch.commands import Command, script
from relaunch.config import Target
from relaunch.errors import ConfigError
from relaunch.runfiles import trainer_env
from tasks.common import Progress, StepRecord, artifact_key, execute, step_task, timed

WARMUP_TIMEOUT_SECONDS = 3 * 3600

CLEAR = r"""
cache=$1
before=$(du -sb "$cache" 2>/dev/null | cut -f1)
rm -rf -- "$cache" && mkdir -p -- "$cache" && echo "cleared ${before:-0}"
"""

SIZE = r"""du -sb "$1" 2>/dev/null | cut -f1"""


def check_cache_dir(path: str) -> None:
    """The cache is deleted: refuse anything that looks like it could hold more than a cache."""
    parts = PurePosixPath(path).parts
    if len(parts) < 3 and not parts[-1].startswith("torchinductor"):
        raise ConfigError(f"inductor_cache_dir {path!r} is too close to / to be deleted safely; use a dedicated folder")


def plan_warm(target: Target) -> dict[str, Command]:
    check_cache_dir(target.inductor_cache_dir)
    env = {
        **trainer_env(target),
        "PATH": f"{target.venv_dir}/bin:/usr/local/bin:/usr/bin:/bin",
        # Single-threaded compile: the race this step exists to avoid needs several threads.
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "RELAUNCH_WARMUP": "1",
    }
    return {
        "clear": script(CLEAR, target.inductor_cache_dir, label="clear inductor cache"),
        "warm": script(target.warmup_command or "true", label="warm-up", env=env, cwd=target.repo_dir, timeout_seconds=WARMUP_TIMEOUT_SECONDS),
        "size": script(SIZE, target.inductor_cache_dir, label="cache size"),
    }


@step_task("warm_cache", retries=1)
def warm_cache(target: Target) -> StepRecord:
    plan = plan_warm(target)
    progress = Progress(artifact_key(target.name, "warm-cache"), "warming the compile cache")
    with timed("warm_cache") as detail:
        progress.update(5, f"clearing {target.inductor_cache_dir}")
        detail["cleared_bytes"] = int(execute(target, plan["clear"]).stdout.split()[-1])
        if target.warmup_command:
            progress.update(20, "compiling every kernel once, single-threaded (forward and backward)")
            out = execute(target, plan["warm"], advice="the warm-up failed: run the warm-up command by hand in the venv to see why").stdout
            detail["warmup_output"] = out.strip().splitlines()[-3:]
        detail["cache_bytes"] = int(execute(target, plan["size"]).stdout.strip() or 0)
        progress.update(100, f"cache warm: {detail['cache_bytes'] / 1e6:.1f} MB")
    return StepRecord(step="warm_cache", seconds=detail.pop("seconds"), detail=detail)
