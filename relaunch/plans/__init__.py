"""The host commands of each recovery step, built by pure functions (`plan_*`) and read back by pure ones (`parse_*`).

Core: nothing here imports Prefect, `relaunch.tasks` or `relaunch.flows`, so `relaunch recover --dry-run` and
`relaunch stop` start without Prefect. The tasks in tasks/ run these commands; the dry run prints them.

`PLANS` is the procedure table: for each step of a full recovery, the commands it runs, in order, named as the
dry run shows them. Values a step only learns on the host (which checkpoint to resume from) or that the run
fixes when it starts (the stamp of its venv and patch, the run id) are passed in or shown as placeholders.
"""

from __future__ import annotations

from collections.abc import Callable

from relaunch.config import Target
from relaunch.plans.launch import plan_launch, plan_list_checkpoints
from relaunch.plans.leftovers import plan_reap
from relaunch.plans.preflight import plan_preflight
from relaunch.plans.rebuild_venv import plan_build, plan_swap
from relaunch.plans.restore_code import plan_restore
from relaunch.plans.stop import plan_stop
from relaunch.plans.warm_cache import plan_warm
from relaunch.vocabulary import Step
from relaunch.wire.commands import Command

RUN_ID = "<RUN_ID>"
NEWEST = "<newest usable checkpoint>"

# (what, command) of each command a step runs, from the target and the recovery's stamp.
Planned = list[tuple[str, Command]]


def _launch(target: Target, stamp: str) -> Planned:
    listing = plan_list_checkpoints(target)
    # The launch resumes from what the listing shows; the choice is made in Python after it (relaunch/deciding/checkpoints.py).
    launch = ("launch", plan_launch(target, RUN_ID, NEWEST if listing else None)[0])
    return [("list checkpoints", listing), launch] if listing else [launch]


PLANS: dict[Step, Callable[[Target, str], Planned]] = {
    Step.PREFLIGHT: lambda target, stamp: [("preflight", plan_preflight(target))],
    Step.STOP_LEFTOVERS: lambda target, stamp: [("stop leftovers", plan_reap(target))],
    Step.BUILD_VENV: lambda target, stamp: list(plan_build(target, stamp).items()),
    Step.STOP: lambda target, stamp: [("stop", plan_stop(target))],
    # The listing of old venvs is followed by removals the prune decides from it: shown by the swap alone.
    Step.REBUILD_VENV: lambda target, stamp: [(name, c) for name, c in plan_swap(target, stamp).items() if name != "siblings"],
    Step.RESTORE_CODE: lambda target, stamp: [("git restore", plan_restore(target, stamp))] if target.restore_paths else [],
    Step.WARM_CACHE: lambda target, stamp: list(plan_warm(target, stamp).items()),
    Step.LAUNCH: _launch,
}
