"""What to do about a verdict: one table from (verdict, cause) to a remediation, and the stop rule."""

from __future__ import annotations

from typing import NamedTuple

from relaunch.judging.findings import Diagnosis
from relaunch.vocabulary import Action, Cause, Step, Verdict


class Remedy(NamedTuple):
    action: Action
    why: str
    # May happen once by bad luck, but not twice: the second time a person must look.
    once_only: bool = False


# (verdict, cause) -> remedy. A cause of None matches any cause of that verdict.
PLAYBOOK: dict[tuple[Verdict, Cause | None], Remedy] = {
    (Verdict.HEALTHY, None): Remedy(Action.NONE, "running well: change nothing"),
    (Verdict.FINISHED, None): Remedy(Action.NONE, "training ran to its end: nothing to recover"),
    (Verdict.STARTING, None): Remedy(Action.NONE, "still starting: wait"),
    (Verdict.STOPPED, None): Remedy(
        Action.NONE, "stopped on purpose with `relaunch stop`: left stopped until `relaunch recover` starts it"
    ),
    (Verdict.PAUSED, None): Remedy(
        Action.NONE, "paused by a person (a stop signal: SIGSTOP, Ctrl-Z, a debugger): left as it is; `kill -CONT PID` resumes it"
    ),
    (Verdict.UNMANAGED, None): Remedy(
        Action.ESCALATE,
        "the target's session holds what relaunch did not start and cannot judge as a training run: nothing is stopped; a person must look",
    ),
    (Verdict.UNMANAGED, Cause.TWO_TRAINERS): Remedy(
        Action.ESCALATE,
        "two trainers of this target run (relaunch's outside the session, another in it): nothing is stopped; a person "
        "keeps one (`relaunch stop` stops relaunch's own), then recovers",
    ),
    (Verdict.UNMANAGED, Cause.NOT_A_TRAINER): Remedy(
        Action.ESCALATE,
        "the target's session holds a program that writes no training log: nothing is stopped; a person must look",
    ),
    (Verdict.UNKNOWN, None): Remedy(Action.FULL_RECOVERY, "no trainer on record: run the full procedure and launch"),
    (Verdict.DEGRADED, None): Remedy(
        Action.REWARM_AND_RELAUNCH,
        "slow run: restore known-good code, clear and re-warm the compile cache, relaunch",
    ),
    (Verdict.STALLED, None): Remedy(
        Action.DUMP_AND_RELAUNCH,
        "hung: keep every thread's stack (py-spy), stop it, relaunch from the newest checkpoint",
    ),
    (Verdict.STALLED, Cause.BLOCKED): Remedy(
        Action.ESCALATE,
        "it waits on something alive that is not its own (a lock another job holds, a device or mount stuck in the kernel): "
        "nothing is stopped, a restart would wait the same; free what the evidence names, or end its holder",
    ),
    (Verdict.DIVERGED, None): Remedy(
        Action.RELAUNCH_EARLIER,
        "diverged: relaunch from the newest checkpoint written before the first non-finite step; escalate if it diverges again",
        once_only=True,
    ),
    (Verdict.CRASHED, Cause.GPU_FAULT): Remedy(
        Action.ESCALATE,
        "a GPU failed: never relaunch onto it; reset or replace the GPU the evidence names, then recover",
    ),
    (Verdict.CRASHED, Cause.DISK_FULL): Remedy(
        Action.ESCALATE,
        "disk full: free space where the evidence says, then recover (checkpoints written as it filled are skipped)",
    ),
    (Verdict.CRASHED, Cause.NATIVE_CRASH): Remedy(
        Action.RELAUNCH,
        "native crash (a signal from its own code): relaunch from the newest checkpoint once; escalate if it repeats",
        once_only=True,
    ),
    (Verdict.CRASHED, Cause.BROKEN_CHECKPOINT): Remedy(
        Action.RELAUNCH_EARLIER,
        "died loading a damaged checkpoint (truncated or corrupt archive): relaunch from the one before it; the broken one is kept, recorded as skipped",
    ),
    (Verdict.CRASHED, Cause.CHECKPOINT_INCOMPATIBLE): Remedy(
        Action.RESTORE_AND_RELAUNCH_SAME,
        "an intact checkpoint this torch or this code cannot load: older ones would fail the same way, so none is skipped; "
        "rebuild the venv to the lock and restore the code to known_good_ref (what drifted), relaunch from the same checkpoint; "
        "if it still does not load, escalate naming the load error",
        once_only=True,
    ),
    (Verdict.CRASHED, Cause.CORRUPT_CACHE): Remedy(
        Action.REWARM_CACHE_AND_RELAUNCH,
        "a damaged compile-cache entry the trainer died loading: move the cache aside (kept, never deleted), warm a fresh one "
        "single-threaded, relaunch from the newest checkpoint; a damaged cache is never a reason to skip a checkpoint",
        once_only=True,
    ),
    (Verdict.CRASHED, Cause.FX_TRACING_RACE): Remedy(
        Action.FULL_RECOVERY,
        "FX tracing race comes from a drifted venv: rebuild it to the exact lock, re-warm single-threaded, relaunch",
    ),
    (Verdict.CRASHED, Cause.MISSING_DEPENDENCY): Remedy(
        Action.INSTALL_AND_RELAUNCH,
        "install the missing package into the venv and relaunch (then add it to the lock)",
    ),
    (Verdict.CRASHED, Cause.COMPILE_ERROR): Remedy(
        Action.REWARM_AND_RELAUNCH,
        "kernel build failed: clear and re-warm the compile cache, relaunch",
    ),
    (Verdict.CRASHED, Cause.SILENT_EXIT): Remedy(Action.RELAUNCH, "vanished without a trace: relaunch from the newest checkpoint"),
    (Verdict.CRASHED, Cause.KILLED): Remedy(Action.RELAUNCH, "killed from outside: relaunch from the newest checkpoint"),
    (Verdict.CRASHED, Cause.DISTRIBUTED_FAILURE): Remedy(
        Action.RELAUNCH,
        "a collective, a rendezvous or torchrun's worker group failed: stop every rank and relaunch them all together from the "
        "newest checkpoint; a rendezvous that never completed escalates instead, naming the rank or node that never joined",
    ),
    (Verdict.CRASHED, Cause.CUDA_OOM): Remedy(
        Action.RELAUNCH,
        "GPU out of memory: relaunch from the newest checkpoint once; if it repeats, reduce memory (e.g. average weights on CPU)",
    ),
    (Verdict.CRASHED, Cause.HOST_OOM_KILLED): Remedy(
        Action.RELAUNCH,
        "host out of memory: relaunch from the newest checkpoint once; if it repeats, reduce host memory use",
    ),
    (Verdict.CRASHED, Cause.ERROR): Remedy(Action.FULL_RECOVERY, "unexplained error: run the full procedure once"),
    (Verdict.CRASHED, None): Remedy(Action.FULL_RECOVERY, "crashed: run the full procedure once"),
}


def remedy(diagnosis: Diagnosis) -> Remedy:
    if diagnosis.cause is Cause.DISK_FULL and not diagnosis.disk_still_full:
        # The log says the disk filled, but the poll finds room again (someone freed it, or a cleanup ran).
        return Remedy(
            Action.RELAUNCH_EARLIER,
            "the disk filled and has room again: relaunch from the newest checkpoint before the last step the log reached",
        )
    if diagnosis.cause is Cause.DISTRIBUTED_FAILURE and diagnosis.rendezvous_incomplete:
        # Relaunched, the ranks would wait for the same missing node: a person must bring it back.
        return Remedy(Action.ESCALATE, f"{diagnosis.summary}; a relaunch would wait for it the same way")
    return PLAYBOOK.get((diagnosis.verdict, diagnosis.cause)) or PLAYBOOK[(diagnosis.verdict, None)]


def resume_constraints(diagnosis: Diagnosis) -> tuple[int | None, str | None]:
    """(resume only from a checkpoint before this step, never from this checkpoint) for the next launch."""
    if diagnosis.verdict is Verdict.DIVERGED:
        return diagnosis.metrics.first_nonfinite_step, None
    if diagnosis.cause is Cause.DISK_FULL:
        # The checkpoint being written when the disk filled is at or after the last step the log reached.
        return diagnosis.metrics.last_step, None
    if diagnosis.cause is Cause.BROKEN_CHECKPOINT and diagnosis.checkpoint:
        return None, diagnosis.checkpoint.rstrip("/").rsplit("/", 1)[-1]
    return None, None


def choose_action(
    diagnosis: Diagnosis, earlier: list[Diagnosis], attempts_left: int, force: bool = False, unfinished: list[str] | None = None
) -> tuple[Action, str]:
    """The next action, or ESCALATE when the same failure repeats with no progress or the budget is spent."""
    action, why, once_only = remedy(diagnosis)
    if diagnosis.verdict is Verdict.STOPPED and not earlier:
        # recover-training meets a deliberately stopped target only when a person asks for it: `check --recover`
        # and the fleet check never hand a stopped run over (Verdict.needs_recovery), so this is that person's word.
        return redo_unfinished(
            Action.RELAUNCH, "stopped on purpose, and a recovery was asked for: relaunch from the newest checkpoint", unfinished or []
        )
    if force and not earlier and diagnosis.verdict not in (Verdict.STARTING, Verdict.UNMANAGED):
        # A person's word (`recover --force`): the whole procedure (venv to the lock, code to known_good_ref, a fresh
        # cache), whatever the check found, since a fix the cause's own action would never try may be what is needed.
        # Never over a program relaunch did not start (unmanaged), nor a run still starting.
        unforced = choose_action(diagnosis, earlier, attempts_left, unfinished=unfinished)[0]
        instead = f"; the check found {_label(diagnosis)}, for which it would {unforced.value}" if unforced is not Action.NONE else ""
        return Action.FULL_RECOVERY, f"forced: run the full procedure whatever the check found{instead}"
    if action is Action.NONE:
        return action, why
    if diagnosis.no_step_fixes:
        return _no_step_fixes(diagnosis, earlier, attempts_left, unfinished or [])
    if earlier and _same_failure(earlier[-1], diagnosis) and not _progressed(earlier[-1], diagnosis):
        # An intact checkpoint that still will not load once venv and code are back to the lock and known_good_ref:
        # nothing drifted, so the load error itself is what a person must read.
        load_error = f": {diagnosis.summary}" if diagnosis.cause is Cause.CHECKPOINT_INCOMPATIBLE else ""
        return (
            Action.ESCALATE,
            f"{_label(diagnosis)} again with no progress after '{remedy(earlier[-1])[0].value}': stopping; a person must look{load_error}",
        )
    if earlier and _same_failure(earlier[-1], diagnosis) and once_only:
        return Action.ESCALATE, f"{_label(diagnosis)} again after '{remedy(earlier[-1])[0].value}': it repeats, so a person must look"
    if attempts_left <= 0:
        return Action.ESCALATE, "attempts budget spent"
    return redo_unfinished(action, why, unfinished or [])


def _no_step_fixes(diagnosis: Diagnosis, earlier: list[Diagnosis], attempts_left: int, unfinished: list[str]) -> tuple[Action, str]:
    """A death no step can change: relaunched once as it is (a one-off, a file that came back), never rebuilt, restored
    or re-warmed; the same death with the same words again escalates, its own line first, with what a person must fix."""
    line = diagnosis.cause_line
    if earlier and _same_failure(earlier[-1], diagnosis) and earlier[-1].cause_line == line:
        return (
            Action.ESCALATE,
            f"{line} | cause: {diagnosis.no_step_fixes}; it repeated with the same words after a relaunch | what to do: fix "
            "the target's launch_command (or create what it names in repo_dir), then `relaunch recover TARGET`",
        )
    if attempts_left <= 0:
        return Action.ESCALATE, f"{line} | cause: {diagnosis.no_step_fixes} | attempts budget spent"
    return redo_unfinished(
        Action.RELAUNCH, f"{line}: {diagnosis.no_step_fixes}: relaunched once as it is, escalated if the same words return", unfinished
    )


def steps_for(action: Action, unfinished: list[str] | None = None) -> list[Step]:
    """The action's steps, plus any step a killed recovery left half done (its marker is on the host), in procedure order."""
    if action in (Action.NONE, Action.ESCALATE):
        return []
    needed = set(action.steps) | _unfinished(unfinished)
    if Step.REBUILD_VENV in needed:
        # The swap after the stop takes what build_venv built aside before it.
        needed.add(Step.BUILD_VENV)
    return [step for step in Step if step in needed]


def redo_unfinished(action: Action, why: str, unfinished: list[str]) -> tuple[Action, str]:
    """Say so when the steps run will redo what an interrupted recovery left half done."""
    extra = _unfinished(unfinished) - set(action.steps)
    if not extra:
        return action, why
    names = ", ".join(s.value for s in Step if s in extra)
    return action, f"{why}; a recovery was interrupted during {names} (its marker is still on the host): redoing it first"


def _unfinished(unfinished: list[str] | None) -> set[Step]:
    """The steps a killed recovery left half done that an action redoes; a step of its own caller (preflight, the
    leftovers, a rollback) is redone by that caller, never added to an action's plan."""
    return {Step(s) for s in unfinished or [] if s in Step._value2member_map_ and Step(s).of_an_action}


def _same_failure(a: Diagnosis, b: Diagnosis) -> bool:
    return (a.verdict, a.cause, a.package) == (b.verdict, b.cause, b.package)


def _progressed(before: Diagnosis, after: Diagnosis) -> bool:
    b, a = before.metrics.last_step, after.metrics.last_step
    return a is not None and (b is None or a > b)


def _label(d: Diagnosis) -> str:
    return f"{d.verdict.value}/{d.cause.value}" if d.cause else d.verdict.value


def playbook_table() -> str:
    """The playbook table of docs/internals.md, generated from PLAYBOOK."""
    rows = ["| verdict | cause | action | steps | why |", "| --- | --- | --- | --- | --- |"]
    for (verdict, cause), (action, why, _) in PLAYBOOK.items():
        steps = " → ".join(s.value for s in action.steps) or "—"
        rows.append(f"| {verdict.value} | {cause.value if cause else 'any'} | {action.value} | {steps} | {why} |")
    return "\n".join(rows)
