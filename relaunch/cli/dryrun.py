"""`relaunch recover --dry-run`: the host commands the full procedure would run, built by the same pure
`plan_*` functions the steps use, printed and never executed (as TorchX's dryrun shows a job before it runs).

Commands that depend on what an earlier one finds (which old cache to remove, which venvs to prune,
which checkpoint to resume from) are shown with that value as a placeholder.
"""

from __future__ import annotations

import shlex

from relaunch.config import Target
from relaunch.host import script_name
from relaunch.vocabulary import Step
from relaunch.wire.commands import Command, host_argv

STAMP = "<STAMP>"
# A script's text is long and fixed (relaunch/host/*.sh): shown by its size, not inline.
LONG_ARGUMENT = 200


def planned(target: Target) -> list[tuple[Step, str, Command]]:
    """(step, what, command) for the full procedure, in the order the recovery runs them: preflight and the
    leftovers' stop first (recover_training runs them before any action), then the full recovery's steps."""
    from relaunch.deciding.playbook import steps_for
    from relaunch.plans import PLANS
    from relaunch.vocabulary import Action

    steps = [Step.PREFLIGHT, Step.STOP_LEFTOVERS, *steps_for(Action.FULL_RECOVERY)]
    return [(step, what, command) for step in steps for what, command in PLANS[step](target, STAMP)]


def shown(command: Command) -> str:
    """The command as data: working folder, environment, argv; long script texts shown by their size."""
    argv = [a if len(a) <= LONG_ARGUMENT else f"<relaunch/host/{script_name(a) or '?'}.sh>" for a in command.argv]
    parts = [f"cd {shlex.quote(command.cwd)} &&"] if command.cwd else []
    parts += [f"{k}={shlex.quote(v)}" for k, v in command.env]
    tracked = f"  # recorded in {command.track_in} while it runs" if command.track_in else ""
    return " ".join([*parts, shlex.join(argv)]) + tracked


def render(target: Target) -> str:
    """Every node's commands, in turn, for a gang (each node's steps run at once with the others')."""
    from relaunch.deciding.gang import indexed

    nodes = indexed(target)
    if not nodes.gang:
        return _render_one(nodes.first)
    head = f"# {target.name}: {len(nodes)} nodes; each step runs on every node at once, the stop on all before any launch"
    return "\n\n".join([head, *(f"# ---- node {k}\n" + _render_one(node) for k, node in nodes)])


def _render_one(target: Target) -> str:
    layers = shlex.join(host_argv(Command(("CMD",)), target.host.container, 1)).replace("'exec CMD'", "CMD")
    where = "here" if target.host.kind == "local" else f"over ssh to {target.host.route}"
    lines = [
        f"# relaunch recover --dry-run: {target.name} on {target.host.label}; the full procedure, nothing is run.",
        f"# Each CMD runs {where} as: {layers} (1: the step's timeout)",
    ]
    for step, what, command in planned(target):
        lines.append(f"\n# {step.value}: {what}" + (f" (timeout {command.timeout_seconds:g} s)" if command.timeout_seconds else ""))
        lines.append(shown(command))
    return "\n".join(lines)
