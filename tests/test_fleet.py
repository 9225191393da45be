"""check-fleet on real trainers in tmux, under a real (temporary) Prefect server."""

from __future__ import annotations

import asyncio
import os

import pytest

from relaunch.flows.check import check_training
from relaunch.flows.fleet import check_fleet
from relaunch.tasks.health import collect_snapshot
from relaunch.tasks.launch import launch
from relaunch.testing.targets import current, runs, shell_target, stop_all, wait_for_exit
from relaunch.vocabulary import Action, Verdict

pytestmark = pytest.mark.usefixtures("prefect_harness")


def fleet_artifact(flow_run_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=["check-fleet"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
                )
            )

    return asyncio.run(read())


def test_a_fleet_check_recovers_only_the_crashed_target_and_leaves_the_healthy_ones_running(tmp_path):
    healthy = [shell_target(tmp_path / f"ok{i}", name=f"ok{i}") for i in range(3)]
    sick = shell_target(tmp_path / "sick", name="sick")
    everyone = [*healthy, sick]
    try:
        before = {t.name: launch.fn(t, 1)[0].run_id for t in healthy}
        # The run crashes for real (exit 3 at step 2); the relaunch, without the fault's environment, keeps running.
        launch.fn(sick.model_copy(update={"env": {"EXIT_AT": "2", "EXIT_CODE": "3"}}), 1)
        wait_for_exit(sick)
        state = check_fleet(everyone, recover=True, max_concurrent=4, return_state=True)
        fleet = state.result()
        alive_after = {t.name: collect_snapshot(t).pid_alive for t in everyone}
    finally:
        stop_all(*everyone)
    rows = {r.target: r for r in fleet.rows}
    assert rows["sick"].found is Verdict.CRASHED and rows["sick"].recovered, rows["sick"]
    assert rows["sick"].verdict is Verdict.HEALTHY and rows["sick"].ok, rows["sick"]
    assert len(runs(sick)) == 2, "the crashed run was relaunched once"
    for t in healthy:
        assert rows[t.name].found is Verdict.HEALTHY and not rows[t.name].recovered, rows[t.name]
        assert runs(t) == [before[t.name]] and current(t) == before[t.name], "a healthy run is left untouched"
    assert all(alive_after.values()), alive_after
    report = next(r for r in fleet.reports if r.target == "sick")
    assert report.attempts[0].verdict is Verdict.CRASHED and report.attempts[-1].verdict is Verdict.HEALTHY
    assert any(s.step == "launch" for a in report.attempts for s in a.steps)
    # Each check announced its verdict, as check-training's do: goodput and the dead-man alarm read those.
    assert all(r.attempts[0].observation is not None for r in fleet.reports), [r.attempts[0] for r in fleet.reports]
    (artifact,) = fleet_artifact(state.state_details.flow_run_id)
    assert artifact.type == "table" and "sick" in str(artifact.data) and "1 recovered" in artifact.description


def test_a_fleet_that_lists_one_run_twice_is_refused_before_any_check(tmp_path):
    target = shell_target(tmp_path, name="twice")
    state = check_fleet([target, target.model_copy(update={"name": "again"})], return_state=True)
    assert state.is_failed()
    with pytest.raises(ValueError, match="are the same run"):
        state.result()
    assert runs(target) == []


def test_the_check_with_recover_on_leaves_a_healthy_run_alone(tmp_path):
    target = shell_target(tmp_path, name="calm")
    try:
        run_id = launch.fn(target, 1)[0].run_id
        report = check_training(target, recover=True)
        still = collect_snapshot(target).pid_alive
    finally:
        stop_all(target)
    assert [(a.verdict, a.action) for a in report.attempts] == [(Verdict.HEALTHY, Action.NONE)] and report.ok
    assert runs(target) == [run_id] and still, "no second trainer beside a healthy one"


def test_the_check_with_recover_on_recovers_a_crashed_run_and_reports_what_it_did(tmp_path):
    target = shell_target(tmp_path, name="fallen")
    try:
        launch.fn(target.model_copy(update={"env": {"EXIT_AT": "2", "EXIT_CODE": "3"}}), 1)
        wait_for_exit(target)
        report = check_training(target, recover=True)
    finally:
        stop_all(target)
    assert report.attempts[0].verdict is Verdict.CRASHED and report.attempts[0].why.startswith("recovering through recover-training")
    assert [a.number for a in report.attempts] == list(range(1, len(report.attempts) + 1))
    assert report.ok and report.verdict is Verdict.HEALTHY and report.flow == "check-training"
    assert report.message.startswith("check found crashed") and len(runs(target)) == 2


def test_a_fleet_checks_result_loaded_from_its_entrypoint_as_a_worker_does_is_readable_by_another_process(tmp_path):
    import json
    import subprocess
    import sys

    from prefect.flows import load_flow_from_entrypoint
    from prefect.settings import PREFECT_API_URL

    target = shell_target(tmp_path / "ok", name="ok")
    # A worker loads the deployment's entrypoint file as a module of its own; a result class defined in that file
    # would be pickled under that module's name, which no other process can import.
    flow = load_flow_from_entrypoint("flows/fleet.py:check_fleet")
    try:
        launch.fn(target, 1)
        state = flow([target], recover=False, return_state=True)
    finally:
        stop_all(target)
    read = (
        "import json, sys; from prefect import get_client; "
        "r = get_client(sync_client=True).read_flow_run(sys.argv[1]).state.result(); "
        "print(json.dumps([type(r).__module__, [row.verdict.value for row in r.rows]]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", read, str(state.state_details.flow_run_id)],
        env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == ["relaunch.records.report", ["healthy"]]


def test_the_python_call_the_docs_show_returns_the_fleet_report_when_a_target_is_not_fine(tmp_path):
    """docs/operations.md: `report = fleet_report(targets, ...)`. The flow itself ends Failed (a person must be told),
    so calling it raised `TypeError: Unexpected result for failed state`; the report is what a caller wants."""
    from relaunch.flows.fleet import fleet_report

    sick = shell_target(tmp_path / "sick", name="sick", env={"EXIT_AT": "2", "EXIT_CODE": "3"})
    try:
        launch.fn(sick, 1)
        wait_for_exit(sick)
        report = fleet_report([sick], recover=False)
        with pytest.raises(Exception, match="Unexpected result for failed state|cannot be resolved into an exception"):
            check_fleet([sick], recover=False)
    finally:
        stop_all(sick)
    assert report.rows[0].found is Verdict.CRASHED and not report.rows[0].ok and "1 crashed" in report.summary()
