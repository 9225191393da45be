"""Step 5: clear the inductor cache, then warm it single-threaded with the trainer's own environment.

Clearing never runs `rm -rf` on the configured path: the cache is moved aside, a fresh folder takes its
place, and the aside copy is removed only when it holds nothing but compile-cache entries. Anything else
found there is kept aside and named in the report. The fresh folder carries `.relaunch-warming` until
the warm-up has finished, so a recovery killed mid-warm-up is seen and redone by the next one.
"""

from __future__ import annotations

from relaunch.config import Target
from relaunch.errors import CommandFailed
from relaunch.plans.warm_cache import foreign_entries, parse_aside, plan_remove_aside, plan_warm
from relaunch.runlayout import utc_stamp
from relaunch.steps import StepRecord, WarmDetail
from relaunch.tasks.common import Progress, artifact_key, execute, log, step_task, timed
from relaunch.tasks.leftovers import stop_earlier_try
from relaunch.vocabulary import Step
from relaunch.wire.commands import Command

IN_USE = 5  # cache_remove_aside.sh: a process still uses the aside copy


def clear_cache(target: Target, plan: dict[str, Command], detail: WarmDetail, keep_aside: bool = False) -> None:
    aside, before, kind, entries = parse_aside(execute(target, plan["clear"]).stdout)
    detail.cleared_bytes = before
    if aside is None:
        return
    if keep_aside:
        # A cache the trainer died loading: the damaged entries are the evidence a person (or a bug report) needs.
        detail.kept_aside = aside
        log().warning("the damaged compile cache %s is kept as %s: remove it yourself once looked at", target.inductor_cache_dir, aside)
        return
    foreign = foreign_entries(kind, entries)
    if foreign:
        detail.kept_aside = aside
        log().warning(
            "the old cache %s held %d entries that are not compile cache (%s): kept as %s, remove it yourself when sure",
            target.inductor_cache_dir,
            len(foreign),
            ", ".join(foreign[:5]),
            aside,
        )
        return
    removed = execute(target, plan_remove_aside(target, aside), check=False)
    if removed.exit_code == IN_USE:
        # Another job shares this cache (it has a file open or a kernel loaded there): moved aside, never removed.
        detail.kept_aside = aside
        log().warning("%s", " ".join(removed.stdout.split()))
    elif removed.exit_code != 0:
        raise CommandFailed(
            target.host.label, "remove the old compile cache", removed, "look at the folder named and remove it by hand if sure"
        )


@step_task("warm_cache", retries=1)
def warm_cache(target: Target, keep_aside: bool = False) -> StepRecord:
    """keep_aside: the old cache is moved aside and kept whatever it holds (a damaged cache: corrupt_cache)."""
    stop_earlier_try(target)
    plan = plan_warm(target, utc_stamp())
    progress = Progress(artifact_key(target.name, "warm-cache"), "warming the compile cache")
    detail = WarmDetail()
    with timed() as clock:
        progress.update(5, f"clearing {target.inductor_cache_dir}")
        clear_cache(target, plan, detail, keep_aside)
        if target.warmup_command:
            progress.update(20, "compiling every kernel once, single-threaded (forward and backward)")
            out = execute(target, plan["warm"], advice="the warm-up failed: run the warm-up command by hand in the venv to see why").stdout
            detail.warmup_output = out.strip().splitlines()[-3:]
        execute(target, plan["done"])
        detail.cache_bytes = int(execute(target, plan["size"]).stdout.strip() or 0)
        progress.update(100, f"cache warm: {detail.cache_bytes / 1e6:.1f} MB")
    return StepRecord(step=Step.WARM_CACHE, seconds=clock.seconds, detail=detail)
