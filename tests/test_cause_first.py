"""Issue 45: the cause first, everywhere a person looks, and no repeat of what no step can fix.

A launch command the program refuses (exit 2: Python's `can't open file`, argparse's usage error) is relaunched once as
it is, never rebuilt, restored or re-warmed again, and escalates when the same words return: the trainer's own line
first in the message, the run's name, the CLI's last line and the notification's evidence, with its cause and what to do.
Every line here is from a real run of a real target (relaunch/testing/targets.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from relaunch.deciding.playbook import choose_action
from relaunch.flows.outcome import _payload, ending, report_of
from relaunch.flows.recover import recover_training
from relaunch.judging.findings import Diagnosis
from relaunch.judging.gone import _refused_command
from relaunch.records.report import HEADLINE_CAUSE_CHARS, Report
from relaunch.testing.targets import shell_target, stop_all
from relaunch.vocabulary import Action, Cause, Step, Verdict

pytestmark = pytest.mark.usefixtures("prefect_harness")

FULL = [Step.BUILD_VENV, Step.STOP, Step.REBUILD_VENV, Step.RESTORE_CODE, Step.WARM_CACHE, Step.LAUNCH]


def recovered(tmp_path: Path, launch_command: str, script: str | None = None) -> Report:
    target = shell_target(tmp_path, launch_command=launch_command)
    if script is not None:
        (Path(target.repo_dir) / "train.py").write_text(script)
    try:
        return report_of(recover_training(target, return_state=True))
    finally:
        stop_all(target)


def steps(report: Report) -> list[list[Step]]:
    return [[s.step for s in a.steps] for a in report.attempts]


def test_a_launch_command_naming_a_missing_script_escalates_after_one_plain_relaunch_with_pythons_line_first(tmp_path):
    report = recovered(tmp_path, "python no_such_script.py")
    said = f"python: can't open file '{tmp_path}/repo/no_such_script.py': [Errno 2] No such file or directory"
    # One full procedure for the never-launched target, then one plain relaunch: no second rebuild, restore or warm.
    assert steps(report) == [FULL, [Step.STOP, Step.LAUNCH], []], report.timeline()
    assert [a.action for a in report.attempts] == [Action.FULL_RECOVERY, Action.RELAUNCH, Action.ESCALATE]
    assert report.outcome() == "escalated"
    # The one place: the message starts with the trainer's own line, then the cause, then what to do.
    assert report.message.startswith(f"{said} | cause: the launch command was refused as given (exit 2"), report.message
    assert "what to do: fix the target's launch_command" in report.message
    # The run's name, the Failed state's message, the notification's first evidence line all take it.
    name = report.headline()
    assert name.startswith("unknown -> escalated: python: can't open file '/") and name.endswith(
        "no_such_script.py': [Errno 2] No such file or directory"
    ), name
    assert len(name) <= len("unknown -> escalated: ") + HEADLINE_CAUSE_CHARS
    state = ending(report)
    assert state.startswith(f"t on local: crashed (error): {said} | cause:") and state.count("what to do:") == 1, state
    assert _payload(report)["evidence"][0] == said


def test_an_argparse_usage_error_escalates_after_one_relaunch_naming_its_error_line(tmp_path):
    script = "import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr', type=float)\np.parse_args()\n"
    report = recovered(tmp_path, "python train.py --learning-rate 3e-4", script)
    said = "train.py: error: unrecognized arguments: --learning-rate 3e-4"
    assert steps(report) == [FULL, [Step.STOP, Step.LAUNCH], []], report.timeline()
    last = report.attempts[-1]
    # argparse prints its usage line, then its error: the error is the cause, the banner never first.
    assert last.evidence[0] == said and last.evidence[1].startswith("usage: train.py"), last.evidence
    assert report.message.startswith(f"{said} | cause:"), report.message


def test_a_trainer_that_exits_1_without_a_traceback_still_gets_the_full_procedure(tmp_path):
    report = recovered(tmp_path, "python train.py", "print('bad input, giving up')\nraise SystemExit(1)\n")
    assert steps(report)[:2] == [FULL, FULL], report.timeline()
    assert report.attempts[1].evidence[0] == "bad input, giving up"
    assert report.attempts[1].summary == "exited 1 without a traceback"


def test_a_refused_command_whose_words_change_is_relaunched_again_not_escalated(tmp_path):
    report = recovered(tmp_path, "python no_such_script.py")
    first, again = _diagnosis(report, 1), _diagnosis(report, 2)
    # A person fixed one missing file and the next is missing: new words, so one more plain relaunch.
    again = again.model_copy(update={"evidence": [again.evidence[0].replace("no_such_script", "other_script"), *again.evidence[1:]]})
    assert choose_action(again, [first], attempts_left=2)[0] is Action.RELAUNCH
    assert choose_action(_diagnosis(report, 2), [first], attempts_left=2)[0] is Action.ESCALATE


def _diagnosis(report: Report, i: int) -> Diagnosis:
    a = report.attempts[i]
    assert a.verdict is Verdict.CRASHED
    refused = _refused_command(2, a.metrics, a.evidence)
    return Diagnosis(verdict=a.verdict, cause=a.cause, summary=a.summary, evidence=a.evidence, metrics=a.metrics, no_step_fixes=refused)


def test_a_forced_recovery_runs_the_full_procedure_on_a_crashed_run_and_says_so(tmp_path):
    target = shell_target(tmp_path, launch_command="python no_such_script.py")
    try:
        report_of(recover_training(target, return_state=True))
        forced = report_of(recover_training(target, force=True, return_state=True))
    finally:
        stop_all(target)
    first = forced.attempts[0]
    # The run is crashed (a refused command would get a plain relaunch): forced, it gets the whole procedure.
    assert (first.verdict, first.action) == (Verdict.CRASHED, Action.FULL_RECOVERY), forced.timeline()
    assert (
        first.why == "forced: run the full procedure whatever the check found; the check found crashed/error, for which it would relaunch"
    )
    assert steps(forced) == [FULL, []], forced.timeline()


def test_a_trainer_that_exits_2_after_stepping_is_not_taken_for_a_refused_command(tmp_path):
    report = recovered(tmp_path, "EXIT_AT=3 EXIT_CODE=2 STEP_SECONDS=0.05 bash stepper.sh")
    second = report.attempts[1]
    # It ran: its command line was accepted, so its exit 2 is its own business, and the full procedure runs.
    assert (second.verdict, second.summary, second.action) == (Verdict.CRASHED, "exited 2 without a traceback", Action.FULL_RECOVERY)
    assert second.evidence[0].startswith("step=3 loss="), second.evidence


def test_a_pth_line_python_reported_and_skipped_is_not_the_cause_the_error_that_ended_the_process_is(tmp_path):
    script = "import site\nsite.addsitedir('pth')\nprint(undefined_name)\n"
    target = shell_target(tmp_path, launch_command="python train.py")
    (Path(target.repo_dir) / "pth").mkdir()
    (Path(target.repo_dir) / "pth" / "leftover.pth").write_text("import p5k_no_such_module_xyz\n")
    (Path(target.repo_dir) / "train.py").write_text(script)
    try:
        report = report_of(recover_training(target, return_state=True))
    finally:
        stop_all(target)
    second = report.attempts[1]
    # Python printed the .pth's ModuleNotFoundError and went on; the NameError ended it: no package is installed.
    assert (second.cause, second.package) == (Cause.ERROR, None), report.timeline()
    assert second.evidence[0] == "NameError: name 'undefined_name' is not defined", second.evidence
    assert second.action is not Action.INSTALL_AND_RELAUNCH
