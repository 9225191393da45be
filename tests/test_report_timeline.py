"""What the terminal prints of a recovery (`relaunch recover`, `check --recover`) says what the markdown report says."""

from __future__ import annotations

from relaunch.records.report import TIMELINE_NOTES, Attempt, Report
from relaunch.steps import LaunchDetail, StepRecord, StopDetail, counted
from relaunch.vocabulary import Action, Cause, Step, Verdict

WHY = "step_20.pt: the highest step whose format proves it whole; skipped 1: step_30.pt (cut short: 1627107 bytes of a zip's start)"


def recovered(stop: StopDetail) -> Report:
    launch = LaunchDetail(run_id="r1", log_path="/l", pid=7, checkpoint="/ckpt/step_20.pt", checkpoint_why=WHY, command="python train.py")
    steps = [StepRecord(step=Step.STOP, seconds=1.2, detail=stop), StepRecord(step=Step.LAUNCH, seconds=0.4, detail=launch)]
    crashed = Attempt(number=1, verdict=Verdict.CRASHED, cause=Cause.BROKEN_CHECKPOINT, action=Action.RELAUNCH, steps=steps)
    return Report(target="t", host="h", flow="recover-training", attempts=[crashed])


def test_the_timeline_names_the_checkpoint_resumed_from_and_what_was_skipped_under_the_launch():
    lines = recovered(StopDetail()).timeline()
    launch_at = next(i for i, line in enumerate(lines) if line.strip().startswith("launch"))
    assert lines[launch_at + 1].strip() == f"checkpoint: {WHY}"


def test_a_step_with_many_notes_shows_a_few_and_says_how_many_more_the_report_has():
    stop = StopDetail(signalled=[1], killed=[2], survivors=["3", "4", "5"], panes_left=["%1"])
    notes = stop.notes()
    lines = recovered(stop).timeline()
    assert [line.strip() for line in lines if line.startswith("        ")][:TIMELINE_NOTES] == notes[:TIMELINE_NOTES]
    assert f"(+{len(notes) - TIMELINE_NOTES} more in the report)" in "\n".join(lines)


def test_a_count_of_one_is_singular():
    assert (counted(1, "package"), counted(0, "package"), counted(12, "package")) == ("1 package", "0 packages", "12 packages")
