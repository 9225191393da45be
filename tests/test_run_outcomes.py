"""What a person sees at 3 a.m. (issue 34): each flow run is named by what happened and ends in a state named for it;
a Failed run has an ERROR line saying what to do; a refusal is an escalation, never a crash; a progress artifact ends
with the step's verdict. Real flows on real (bash) trainers, read back from the real (temporary) Prefect server."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest

from relaunch.errors import CheckpointUnusable
from relaunch.flows.check import check_training
from relaunch.flows.fleet import check_fleet
from relaunch.flows.recover import recover_training
from relaunch.tasks.launch import launch
from relaunch.testing.faults import wait_for
from relaunch.testing.targets import shell_target, stop_all, wait_for_exit

pytestmark = pytest.mark.usefixtures("prefect_harness")

CRASH = {"EXIT_AT": "2", "EXIT_CODE": "3"}  # the bash trainer exits 3 after its second step: crashed (error)


def api(call):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return call(client)


def flow_run_of(state):
    return api(lambda c: c.read_flow_run(state.state_details.flow_run_id))


def logs_of(flow_run_id: UUID, until: str | None = None) -> list:
    """The run's stored log lines (WARNING and above: the tests' logging level), waiting until one holds `until`."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    def read():
        found = api(lambda c: c.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200))
        return found if until is None or any(until in line.message for line in found) else None

    return wait_for(read, 30, f"a log line of {flow_run_id} holding {until!r}", interval=0.2)


def errors_of(flow_run_id: UUID, until: str) -> list[str]:
    """The run's own ERROR lines (not Prefect's `Finished in state Failed` of a task run) once one holds `until`."""
    return [line.message for line in logs_of(flow_run_id, until) if line.level >= 40 and "Finished in state" not in line.message]


def crashed(tmp_path: Path, name: str, **overrides):
    """A target whose trainer ran two steps and exited 3; relaunched without CRASH it runs on healthy."""
    target = shell_target(tmp_path, name=name, **overrides)
    launch.fn(target.model_copy(update={"env": CRASH}), 1)
    wait_for_exit(target)
    return target


def test_a_recovered_crash_is_named_found_then_recovered_and_ends_completed_named_recovered(tmp_path):
    target = crashed(tmp_path, "mended")
    try:
        state = recover_training(target, return_state=True)
    finally:
        stop_all(target)
    run = flow_run_of(state)
    assert run.name == "recover-mended: crashed (error) -> recovered", run.name
    assert run.state.is_completed() and run.state.name == "Recovered", (run.state.type, run.state.name)
    assert state.result().ok, "the report is still the state's data"


def test_an_escalation_ends_failed_named_escalated_with_an_error_line_that_says_what_to_do(tmp_path):
    # A trainer that can never start: one full recovery (max_attempts 1), the same crash again, the playbook escalates.
    target = shell_target(tmp_path, name="hopeless", launch_command="python3 -c \"import json; json.loads('{broken')\"", max_attempts=1)
    try:
        state = recover_training(target, return_state=True)
    finally:
        stop_all(target)
    run = flow_run_of(state)
    # The name ends with the cause's own line (issue 45: the cause first, everywhere a person looks).
    assert run.name.startswith("recover-hopeless: unknown -> escalated: json.decoder.JSONDecodeError: Expecting property name"), run.name
    assert run.state.is_failed() and run.state.name == "Escalated", (run.state.type, run.state.name)
    assert "what to do:" in run.state.message, run.state.message
    (line,) = errors_of(run.id, "what to do")
    assert line.startswith("hopeless: unknown -> escalated: ") and "\n  what to do: look at the report artifact" in line, line


def test_a_refused_preflight_ends_escalated_with_what_to_do_and_no_traceback(tmp_path):
    target = crashed(tmp_path, "full")
    try:
        state = recover_training(target.model_copy(update={"min_free_disk_gb": 1e9}), return_state=True)
    finally:
        stop_all(target)
    run = flow_run_of(state)
    assert run.name == "recover-full: escalated (PreflightFailed)" and run.state.name == "Escalated", (run.name, run.state.name)
    (line,) = errors_of(run.id, "what to do")
    assert "only" in line and "MiB free" in line and "what to do: fix what the PreflightFailed above names" in line, line
    assert not [m for m in errors_of(run.id, "what to do") if "Traceback" in m]


def test_a_healthy_check_is_named_by_its_verdict_and_ends_plainly_completed(tmp_path):
    target = shell_target(tmp_path, name="fine")
    launch.fn(target, 1)
    try:
        state = check_training(target, return_state=True)
    finally:
        stop_all(target)
    run = flow_run_of(state)
    assert run.name == "check-fine: healthy" and run.state.name == "Completed", (run.name, run.state.name)


def test_a_sick_check_not_asked_to_recover_is_named_so_and_its_failed_run_has_an_error_line_with_what_to_do(tmp_path):
    target = crashed(tmp_path, "sick")
    try:
        state = check_training(target, return_state=True)
    finally:
        stop_all(target)
    run = flow_run_of(state)
    assert run.name == "check-sick: crashed (error) -> not recovered" and run.state.name == "Failed", (run.name, run.state.name)
    (line,) = errors_of(run.id, "what to do")
    assert "what to do: recover it" in line, line


def test_check_fleet_is_named_by_its_fleet_and_what_came_of_it(tmp_path):
    fine, sick = shell_target(tmp_path / "a", name="fleet-a"), crashed(tmp_path / "b", "fleet-b")
    launch.fn(fine, 1)
    try:
        state = check_fleet([fine, sick], return_state=True)
    finally:
        stop_all(fine, sick)
    run = flow_run_of(state)
    assert run.name == "check-fleet: 2 targets: 2 healthy; 1 recovered", run.name


def test_the_health_progress_artifact_of_a_start_up_ends_at_100_with_the_final_verdict(tmp_path):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    # Two seconds of start-up: the first polls say `starting`, which opens the bar; then three steps settle it healthy.
    target = shell_target(tmp_path, name="slow", env={"START_SECONDS": "2"})
    launch.fn(target, 1)
    try:
        state = check_training(target, return_state=True)
    finally:
        stop_all(target)
    run = flow_run_of(state)
    (bar,) = api(
        lambda c: c.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["slow-health"]), flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
        )
    )
    assert bar.type == "progress" and bar.data == 100, (bar.type, bar.data, bar.description)
    assert bar.description.startswith("healthy: "), bar.description


def test_a_recovery_with_no_checkpoint_it_may_resume_from_ends_escalated_not_crashed_and_is_told(tmp_path):
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    target = crashed(tmp_path, "nockpt")
    ckpt = Path(target.checkpoint_dir)
    ckpt.mkdir(parents=True, exist_ok=True)
    for name in ("step_1000_model.pt", "step_1000_optim.pt"):  # one step saved as two files: relaunch cannot tell which to give
        (ckpt / name).write_bytes(b"x" * 64)
    try:
        state = recover_training(target, return_state=True)
    finally:
        stop_all(target)
    run = flow_run_of(state)
    assert run.state.is_failed() and run.state.name == "Escalated", (run.state.type, run.state.name, run.state.message)
    assert run.name == "recover-nockpt: crashed (error) -> escalated (CheckpointUnusable)", run.name
    assert "no checkpoint relaunch can resume from" in run.state.message and "what to do: tell relaunch how to resume" in run.state.message
    refusal = state.result(raise_on_failure=False)
    assert isinstance(refusal, CheckpointUnusable) and refusal.report.refusal == "CheckpointUnusable", (
        "a Python caller still gets the error"
    )
    logs = logs_of(run.id, "what to do")
    assert not [line.message for line in logs if "Traceback" in line.message or "encountered an exception" in line.message.lower()], [
        line.message for line in logs
    ]
    (line,) = [line.message for line in logs if line.level >= 40 and "Finished in state" not in line.message]
    assert "escalated (CheckpointUnusable)" in line and "what to do: tell relaunch how to resume" in line, line
    (event,) = wait_for(
        lambda: (
            api(
                lambda c: c.read_events(
                    filter=EventFilter(
                        event=EventNameFilter(name=["relaunch.recovery.escalated"]),
                        resource=EventResourceFilter(id=["relaunch.target.nockpt"]),
                    ),
                    limit=50,
                )
            ).events
        ),
        60,
        "the escalation event to be stored",
    )
    assert event.resource["relaunch.refusal"] == "CheckpointUnusable" and f"prefect.flow-run.{run.id}" in [r.id for r in event.related]
    assert "no checkpoint relaunch can resume from" in event.payload["message"], event.payload
