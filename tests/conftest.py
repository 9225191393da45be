"""Shared test set-up: an isolated Prefect home, no telemetry, the project venv's tools (uv) on PATH."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

_HOME = tempfile.mkdtemp(prefix="relaunch-prefect-")
os.environ["PREFECT_HOME"] = _HOME
os.environ["DO_NOT_TRACK"] = "1"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_LOGGING_LEVEL"] = os.environ.get("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def prefect_harness():
    """One real (temporary) Prefect server for the whole session: ~7 s once, not per test."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        yield


# The longest tests, as `make test`'s --durations measured them (seconds, 2 cores, -n 3, 2026-12-02). Collected last,
# as pytest would order them, they made the suite's tail: one worker still ran a demo scenario while the others were
# idle. Put at the head of each worker's share instead (longest first, dealt round the workers), they run beside the
# short tests and the suite ends when the short ones do.
LONGEST: dict[str, float] = {
    "tests/test_recover_flow.py::test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first[degraded]": 143,
    "tests/test_recover_flow.py::test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first[fx-race]": 131,
    "tests/test_cli.py::test_the_demo_writes_its_target_file_and_says_how_to_check_it": 124,
    "tests/test_recover_flow.py::test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first[diverged]": 110,
    "tests/test_recover_flow.py::test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first[corrupt-cache]": 109,
    "tests/test_recover_flow.py::test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first[silent-death]": 109,
    "tests/test_scale_concurrency.py::test_a_worker_killed_mid_recovery_frees_the_host_within_a_lease_and_a_later_run_recovers_it_with_one_trainer": 109,
    "tests/test_recover_flow.py::test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first[broken-checkpoint]": 100,
    "tests/test_deployments.py::test_the_demo_deployment_recovers_the_prepared_demo_target_as_deployed": 99,
    "tests/test_serve_terminal.py::test_a_new_make_serve_stops_what_a_killed_one_left_and_three_ctrl_c_kill_at_once": 83,
    "tests/test_scale_demo.py::test_the_scale_demo_recovers_every_broken_host_exactly_once_says_so_in_one_json_line_and_ctrl_c_leaves_nothing_behind": 78,
    "tests/test_recover_flow.py::test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first[missing-dependency]": 71,
    "tests/test_remote_flow.py::test_the_demo_target_recovers_over_ssh_through_a_container": 60,
    "tests/test_ui.py::test_the_flow_run_page_shows_step_at_host_task_runs_and_the_report_artifact_shows_the_verdict": 60,
    "tests/test_deploy.py::test_a_deployed_target_is_recovered_by_its_deployment_on_a_worker_with_only_the_wheel": 52,
    "tests/test_cli.py::test_check_stop_and_logs_work_as_typed_from_a_plain_shell": 50,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deal the longest tests round the xdist workers, each at the head of the share the worker is given first
    (worksteal splits the collected list into equal consecutive shares). Every worker collects the same order."""
    workers = int(getattr(config.option, "numprocesses", None) or 0)
    if workers < 2:
        return
    longest = sorted((i for i in items if i.nodeid in LONGEST), key=lambda i: -LONGEST[i.nodeid])
    rest = iter([i for i in items if i.nodeid not in LONGEST])
    share = -(-len(items) // workers)
    dealt: list[pytest.Item] = []
    for w in range(workers):
        heads = longest[w::workers]
        dealt += heads + [i for _, i in zip(range(share - len(heads)), rest)]
    items[:] = dealt + list(rest)
