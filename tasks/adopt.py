"""Adopt a run a person started in the target's tmux session: record it as the current run, signal nothing.

From then on the health poll judges it by the same rules as relaunch's own runs, and stops and recoveries
treat it as theirs (its pane, its PIDs with start times, its log). Refused, naming why, when the session is
missing or is relaunch's own run, when the state folder belongs to another target, when a trainer of this
target is alive elsewhere, or when no log can be found and none was named.
"""

from __future__ import annotations

from relaunch.config import Target
from relaunch.plans.adopt import Adoption, parse_adoption, plan_adopt
from relaunch.runlayout import utc_stamp
from relaunch.tasks.common import execute, log, step_task


def new_adopted_run_id() -> str:
    return f"{utc_stamp()}-adopted"


def adopt_run(target: Target, log_file: str | None = None) -> Adoption:
    """One host command; a refusal raises CommandFailed with the host's reason (nothing was changed then)."""
    result = execute(
        target,
        plan_adopt(target, new_adopted_run_id(), log_file),
        advice="the output says why and what to do; nothing was changed and nothing was signalled",
    )
    adoption = parse_adoption(result.stdout)
    log().info(
        "%s: adopted the run in tmux session %s as %s: pid %s, log %s (found by %s)",
        target.name,
        target.tmux_session,
        adoption.run_id,
        adoption.pid,
        adoption.log_path,
        adoption.how,
    )
    return adoption


@step_task("adopt")
def adopt(target: Target, log_file: str | None = None) -> Adoption:
    return adopt_run(target, log_file)
