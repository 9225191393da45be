"""The flows end to end on this machine, under a real (temporary) Prefect server."""

from __future__ import annotations

from pathlib import Path

import pytest

from relaunch.demo.scenarios import SCENARIOS, prepare
from relaunch.flows.check import check_training
from relaunch.flows.outcome import report_of
from relaunch.flows.recover import recover_training
from relaunch.tasks.launch import launch
from relaunch.tasks.stop import stop
from relaunch.testing.targets import shell_target
from relaunch.vocabulary import Action, Verdict

pytestmark = pytest.mark.usefixtures("prefect_harness")


# `healthy` runs through the CLI as typed, in tests/test_cli.py: the same flow, not run twice. Each scenario is a minute of
# CPU or more (the incident's own, fx-race, five on a loaded 2-core machine): all are `make test-long`'s (CI runs both);
# the quick suite has the incident's parts (the fx-race captures judged in tests/test_diagnose_fixtures.py, each step on its own).
QUICK: tuple[str, ...] = ()


@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param(name, marks=() if name in QUICK else pytest.mark.long)
        for name, s in SCENARIOS.items()
        if name != "healthy" and s.nodes == 1
    ],
)
def test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first(scenario, tmp_path):
    target = prepare(scenario, tmp_path / scenario)
    try:
        report = recover_training(target)
    finally:
        stop.fn(target)
    expected = SCENARIOS[scenario]
    first = report.attempts[0]
    assert (first.verdict.value, first.cause.value if first.cause else None) == (expected.expected_verdict, expected.expected_cause), (
        report.timeline()
    )
    assert report.ok and report.verdict is Verdict.HEALTHY, report.timeline()
    assert all(a.steps for a in report.attempts[:-1]), "every attempt but the last acted"
    if scenario == "corrupt-cache":
        warmed = [step for a in report.attempts for step in a.steps if step.step == "warm_cache"]
        assert warmed and warmed[0].detail.kept_aside, "the damaged cache was moved aside and kept"
        assert any(Path(warmed[0].detail.kept_aside).glob("??/c*.py")), "with its damaged modules, never deleted"
    if any(step.step == "restore_code" for a in report.attempts for step in a.steps):
        patches = list((Path(target.state_path) / "patches").glob("*.patch"))
        assert patches and "HACK" in patches[0].read_text(), "the hacked model file was saved before the restore"


def test_recovery_of_a_healthy_run_changes_nothing(tmp_path):
    target = shell_target(tmp_path)
    record, _ = launch.fn(target, 1)
    try:
        report = recover_training(target)
        assert [a.action for a in report.attempts] == [Action.NONE]
        assert report.attempts[0].verdict is Verdict.HEALTHY
        assert (Path(target.state_path) / "current").read_text().strip() == record.run_id
    finally:
        stop.fn(target)


def test_a_recovery_tags_its_flow_run_with_target_and_host_and_its_task_runs_not_at_all(tmp_path):
    # Untagged task runs cost Prefect no tag-concurrency calls (flows/outcome.py untagged_tasks).
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    target = shell_target(tmp_path, name="tagged")
    launch.fn(target, 1)
    try:
        state = recover_training(target, return_state=True)
    finally:
        stop.fn(target)
    flow_run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run_id)
        task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    assert {"target:tagged", f"host:{target.host.hostname}"} <= set(flow_run.tags), flow_run.tags
    assert task_runs and all(not t.tags for t in task_runs), [(t.name, t.tags) for t in task_runs]


def test_the_same_failure_twice_without_progress_ends_with_a_clear_report(tmp_path):
    target = shell_target(tmp_path, launch_command="python3 -c \"import json; json.loads('{broken')\"", max_attempts=5)
    try:
        state = recover_training(target, return_state=True)
        report = report_of(state)
    finally:
        stop.fn(target)
    actions = [a.action for a in report.attempts]
    assert actions == [Action.FULL_RECOVERY, Action.FULL_RECOVERY, Action.ESCALATE], report.timeline()
    assert not report.ok and "again with no progress" in report.message
    assert state.is_failed() and "escalate" not in state.message and "again with no progress" in state.message, (
        "a run that gave up is never green"
    )
    assert any("JSONDecodeError" in line for line in report.attempts[-1].evidence)


def test_check_training_reports_the_verdict_and_changes_nothing(tmp_path):
    target = shell_target(tmp_path, env={"EXIT_AT": "2", "EXIT_CODE": "7"})
    launch.fn(target, 1)
    try:
        state = check_training(target, return_state=True)
        report = report_of(state)
    finally:
        stop.fn(target)
    assert state.is_failed() and "crashed" in state.message, "a sick run nobody was asked to recover is a failed check"
    assert report.attempts[0].verdict is Verdict.CRASHED
    assert report.attempts[0].action is Action.FULL_RECOVERY and report.attempts[0].why.startswith("would do")
    assert report.attempts[0].acted is False and "-> would do full_recovery (nothing done)" in report.timeline()[0]
    assert len(list((Path(target.state_path) / "runs").iterdir())) == 1
