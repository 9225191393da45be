"""Step 6: start the trainer detached in tmux through the static launcher and supervisor; resume from the newest checkpoint."""

from __future__ import annotations

from relaunch.config import Target
from relaunch.deciding.checkpoints import Choice, choose
from relaunch.errors import CheckpointUnusable
from relaunch.plans.checkpoint_listing import read_listing
from relaunch.plans.launch import plan_launch, plan_list_checkpoints
from relaunch.runlayout import log_path, new_run_id
from relaunch.steps import LaunchDetail, StepRecord
from relaunch.tasks.common import execute, log, step_task, timed
from relaunch.vocabulary import Step

# What each of launch.sh's refusals means and what to do, by its exit code (its header lists the same codes): a refusal
# says the advice for its own code only.
LAUNCH_ADVICE: dict[int | None, str] = {
    10: "the current run's trainer is alive: stop it (`relaunch stop`) or let it run",
    11: "a tmux session of this name exists: look at it (`tmux attach -t =SESSION`); end it, or rename tmux_session",
    12: "a folder could not be made: see the output",
    13: "tmux could not start the session: see the output",
    14: "the supervisor recorded no PID in time: see the output and the run's log",
    15: "the venv is half-built: run the recovery again (it rebuilds it)",
    16: "the compile cache is half-warmed: run the recovery again (it warms it anew)",
    17: "another launch of this target is under way: let it finish, then check again",
    18: "a live process carries this target's marker, a trainer relaunch no longer records: stop the PIDs named, or adopt the run",
    19: "a live process has files open for writing under checkpoint_dir, e.g. a trainer started by hand: stop it first",
    20: "the state folder belongs to another target: give each target its own state_dir",
    21: "a live process runs the launch command's program in repo_dir, a trainer started by hand outside tmux or under the "
    "target's old name: let it run, or stop it yourself and recover again",
    None: "see the output",
}


def launch_advice(target: Target) -> dict[int | None, str]:
    """LAUNCH_ADVICE with the target's own tmux session named."""
    return {code: text.replace("=SESSION", f"={target.tmux_session}") for code, text in LAUNCH_ADVICE.items()}


def pick_checkpoint(target: Target, listing: str | None, before_step: int | None = None) -> Choice:
    """The newest usable checkpoint from the host's listing, or none, with the reason either way.

    Raises CheckpointUnusable where starting from scratch (or from a guess) could lose work: a folder with
    names but nothing usable, a tracker naming what is not there, a loader that would take a ruled-out one.
    """
    if listing is None:
        return Choice(why="no checkpoint_dir configured: starting from scratch")
    found = read_listing(listing)
    if not found.present:
        return Choice(why=f"checkpoint_dir {target.checkpoint_dir} does not exist: starting from scratch")
    choice = choose(
        found.entries,
        refused=found.refused,
        before_step=before_step,
        links=found.links,
        contents=found.contents,
        run=found.run,
        resume_from=target.resume_from,
        probes=found.probes,
    )
    if choice.escalate:
        raise CheckpointUnusable(
            target.host.label,
            f"list checkpoints {target.checkpoint_dir}",
            target.checkpoint_dir or "",
            choice.escalate,
            choice.skipped,
            _advice(target, choice),
        )
    return choice


def choose_checkpoint(target: Target, before_step: int | None = None, refuse: str | None = None) -> Choice:
    """The checkpoint a launch resumes from, read from the host's listing (reads only)."""
    listing = plan_list_checkpoints(target, refuse)
    return pick_checkpoint(target, execute(target, listing).stdout if listing else None, before_step)


def check_resumable(target: Target, before_step: int | None = None) -> None:
    """Raise CheckpointUnusable when the launch would refuse the checkpoint folder; reads only.

    Asked before a recovery stops a live run: a folder with nothing usable escalates while the run still runs."""
    listing = plan_list_checkpoints(target)
    if listing:
        pick_checkpoint(target, execute(target, listing).stdout, before_step)


def _advice(target: Target, choice: Choice) -> str:
    if choice.blocked_by == "nothing_usable":
        return (
            f"tell relaunch how to resume: set resume_arg so it names the checkpoint your trainer loads (resume_from: folder if "
            f"it takes {target.checkpoint_dir} and finds its own), or move the names above that are no checkpoint out of "
            "checkpoint_dir; to start from scratch on purpose, empty checkpoint_dir (move its contents elsewhere), then recover again"
        )
    if choice.blocked_by == "trajectory":
        return (
            "look at the two saves named above: move the saves of the trajectory the run left (an abandoned branch, an earlier "
            "stage) out of checkpoint_dir, so that the newest write is the highest step; then recover again"
        )
    if choice.blocked_by == "tracker":
        return (
            "look at the tracker named above: make it name a complete checkpoint in checkpoint_dir (or move it and the unfinished "
            "saves it does not cover out of checkpoint_dir), then recover again; relaunch never guesses what the framework would load"
        )
    return (
        "move the checkpoint the loader would take out of checkpoint_dir (or fix its tracker) so that it takes the one relaunch "
        "chose, or set resume_from: entry with a resume_arg that names one checkpoint; then recover again"
    )


def describe(choice: Choice) -> str:
    """One line for the run record and the log: the choice, why, what tracker said so, and what was skipped."""
    skipped = f"; skipped {len(choice.skipped)}: " + ", ".join(choice.skipped[:5]) if choice.skipped else ""
    return (f"{choice.name}: " if choice.name else "") + choice.why + skipped


@step_task("launch")
def launch(
    target: Target,
    attempt: int,
    before_step: int | None = None,
    refuse: str | None = None,
    run_id: str | None = None,
    choice: Choice | None = None,
) -> tuple[LaunchDetail, StepRecord]:
    """Launch from the newest usable checkpoint; `before_step` and `refuse` rule out ones the last failure makes suspect.

    `run_id` is fixed by the caller so that a retry after a dropped connection names the same run: the host
    then adopts the trainer the first try started instead of refusing, or starting, a second one. `choice`: the
    checkpoint chosen already (every node of a gang resumes from the one node 0's listing gave).
    """
    run_id = run_id or new_run_id(attempt)
    with timed() as clock:
        if choice is None:
            choice = choose_checkpoint(target, before_step, refuse)
        if choice.name is None and target.checkpoint_dir:
            log().warning("%s: %s", target.name, describe(choice))
        checkpoint = f"{target.checkpoint_dir}/{choice.name}" if choice.name else None
        command, text = plan_launch(target, run_id, checkpoint)
        out = execute(target, command, advice=launch_advice(target)).stdout.split()
        pid = int(out[0]) if out and out[0].isdigit() else None
        adopted = "adopted" in out
        if adopted:
            log().warning(
                "%s: the connection dropped during launch; run %s (PID %s) had started: adopted, not launched again",
                target.name,
                run_id,
                pid,
            )
        detail = LaunchDetail(
            run_id=run_id,
            log_path=log_path(target, run_id),
            pid=pid,
            checkpoint=checkpoint,
            checkpoint_why=describe(choice),
            command=text,
            adopted=adopted,
        )
    return detail, StepRecord(step=Step.LAUNCH, seconds=clock.seconds, detail=detail)
