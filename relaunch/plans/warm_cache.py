"""The host commands of the compile-cache step (move aside, warm, mark, size) and the reading of what was moved aside; no Prefect."""

from __future__ import annotations

import re

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.plans.launch import trainer_env
from relaunch.plans.leftovers import tracked
from relaunch.wire.commands import Command, script

WARMUP_TIMEOUT_SECONDS = 3 * 3600
WARMING_MARKER = ".relaunch-warming"
CACHE_MARKER = ".relaunch-inductor-cache"

# What torch's inductor writes at the top of its cache dir: code in two-character hash folders, the
# FX-graph, AOT-autograd and triton caches, locks; triton_home is where trainer_env puts Triton's own cache. Anything
# else is not ours to delete.
CACHE_ENTRY = re.compile(
    r"^([a-z0-9]{2}|fxgraph|aotautograd|triton|triton_home|locks|cache|kernel|autotune|aot_inductor|precompile|[a-z0-9_]*cache|\.relaunch-[a-z-]+)$"
)

# Move the cache aside and put a fresh, marked folder in its place. Prints the aside path, its kind
# (`d` folder, `l` link: a link is never followed) and its top-level names, NUL-separated.
MOVE_ASIDE = host_script("cache_move_aside")

# Remove an aside copy the caller judged to be only cache; it must still be the sibling we made.
REMOVE_ASIDE = host_script("cache_remove_aside")

SIZE = host_script("size")


def plan_warm(target: Target, stamp: str) -> dict[str, Command]:
    env = {
        **trainer_env(target),
        "PATH": f"{target.venv_dir}/bin:/usr/local/bin:/usr/bin:/bin",
        # Single-threaded compile: the race this step exists to avoid needs several threads.
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "RELAUNCH_WARMUP": "1",
    }
    cache = target.inductor_cache_dir
    return {
        "clear": script(MOVE_ASIDE, cache, stamp, WARMING_MARKER, CACHE_MARKER, label="move the inductor cache aside", timeout_seconds=600),
        "warm": tracked(
            target,
            script(target.warmup_command or "true", label="warm-up", env=env, cwd=target.repo_dir, timeout_seconds=WARMUP_TIMEOUT_SECONDS),
        ),
        "done": Command(("rm", "-f", "--", f"{cache}/{WARMING_MARKER}"), label="mark the cache warm"),
        "size": script(SIZE, cache, label="cache size"),
    }


def plan_remove_aside(target: Target, aside: str) -> Command:
    return script(REMOVE_ASIDE, target.inductor_cache_dir, aside, label="remove the old compile cache", timeout_seconds=600)


def parse_aside(stdout: str) -> tuple[str | None, int, str, list[str]]:
    """(aside path, its bytes, its kind, its top-level names) from MOVE_ASIDE's NUL-separated records."""
    fields: dict[str, str] = {}
    entries: list[str] = []
    for record in stdout.split("\0"):
        key, _, value = record.partition(" ")
        if key == "entry":
            entries.append(value)
        elif key:
            fields[key] = value
    return fields.get("aside"), int(fields.get("bytes") or 0), fields.get("kind", ""), entries


def foreign_entries(kind: str, entries: list[str]) -> list[str]:
    """What in the old cache is not compile cache; a link counts as foreign (it points somewhere else)."""
    if kind == "l":
        return ["(a symbolic link)"]
    if CACHE_MARKER in entries:
        # relaunch made this folder empty; since then only the warm-up and the trainer wrote to it.
        return []
    return [name for name in entries if not CACHE_ENTRY.match(name)]
