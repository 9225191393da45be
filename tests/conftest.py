"""Shared test set-up: an isolated Prefect home, no telemetry, the project venv's tools (uv) on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# Every core busy (the judging tests run loaded too) makes an example take seconds now and then, most often the first:
# a verdict is the property, never how long one example took. No deadline for any generated test.
settings.register_profile("relaunch", deadline=None)
settings.load_profile("relaunch")

_HOME = tempfile.mkdtemp(prefix="relaunch-prefect-")
os.environ["PREFECT_HOME"] = _HOME
os.environ["DO_NOT_TRACK"] = "1"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_LOGGING_LEVEL"] = os.environ.get("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def prefect_harness():
    """One real (temporary) Prefect server for the whole session: ~7 s once, not per test.

    Up to 240 s to answer its health check: with every core busy (`make test` beside two CPU hogs on two cores, four
    workers each starting its own server and migrating its database at once) a start took over 60 s, and a
    session-scoped start that fails fails every test of that worker that needs the server (133 errors, no verdict wrong)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=240):
        yield


@pytest.fixture(scope="session", autouse=True)
def _tmux_server_kept() -> Iterator[None]:
    """One idle session of each test process's own on the shared tmux server, for the session's length.

    tmux exits when its last session ends, and it destroys every session it holds as it exits, also one a client created
    in that moment: a test's new session, created just as another test's last one ended, was destroyed under its trainer
    a second after the launch (seen: the trainer hung up, exit 129, recorded as a deliberate stop, while no tmux command
    had named its session; the server's PID changed at that moment). Kept alive, the server never exits between tests.
    Tests that end a tmux server start their own (TMUX_TMPDIR)."""
    if shutil.which("tmux") is None:
        yield
        return
    name = f"relaunch-tests-keeper-{os.getpid()}"
    # No marker, no trainer's environment: a stop or a launch guard never sees it as a target's.
    # In /, not in a repo_dir: no launch guard takes its `sleep` for a program running in a target's repository.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAUNCH_") and k not in ("TMUX", "TMUX_PANE")}
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-c", "/", "sleep", "infinity"], env=env, cwd="/", capture_output=True)
    try:
        yield
    finally:
        subprocess.run(["tmux", "kill-session", "-t", f"={name}"], env=env, capture_output=True)


# The longest tests, as `make test`'s --durations measured them (seconds in the suite, 2 cores, -n 4, 2026-12-02, 830 tests). Collected
# last, as pytest would order them, they made the suite's tail: one worker still ran a demo scenario while the others
# were idle. Put at the head of each worker's share instead (longest first, dealt round the workers), they run beside
# the short tests and the suite ends when the short ones do. A key that is a file is that file's tests as one unit, in
# their order: they share a module fixture (a scale-out engine, a gang of namespace hosts) that each worker running
# one of them would build again.
LONGEST: dict[str, float] = {
    "tests/test_scale_concurrency.py": 230,
    "tests/test_serve_terminal.py": 195,
    "tests/test_gang.py": 190,
    "tests/test_deployments.py": 190,
    "tests/test_recover_flow.py::test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first[degraded]": 156,
    "tests/test_recover_flow.py::test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first[broken-checkpoint]": 147,
    "tests/test_recover_flow.py::test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first[silent-death]": 134,
    "tests/test_recover_flow.py::test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first[fx-race]": 132,
    "tests/test_recover_flow.py::test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first[diverged]": 114,
    "tests/test_cli.py::test_the_demo_writes_its_target_file_and_says_how_to_check_it": 104,
    "tests/test_remote_flow.py::test_the_demo_target_recovers_over_ssh_through_a_container": 86,
    "tests/test_recover_flow.py::test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first[corrupt-cache]": 83,
    "tests/test_gang_demo.py": 80,
    "tests/test_scale_demo.py::test_the_scale_demo_recovers_every_broken_host_exactly_once_says_so_in_one_json_line_and_ctrl_c_leaves_nothing_behind": 68,
    "tests/test_ui.py::test_the_flow_run_page_shows_step_at_host_task_runs_and_the_report_artifact_shows_the_verdict": 58,
    "tests/test_recover_flow.py::test_each_demo_scenario_ends_healthy_and_names_its_injected_cause_first[missing-dependency]": 53,
    "tests/test_deploy.py::test_a_deployed_target_is_recovered_by_its_deployment_on_a_worker_with_only_the_wheel": 48,
    "tests/test_cli.py::test_check_stop_and_logs_work_as_typed_from_a_plain_shell": 43,
}


# `make test-long`'s share, beside the tests marked `long` where they are defined (the demo scenarios, the demo over SSH,
# the serve-demo deployment): the end-to-end runs of a whole control plane or of a whole demo, each minutes of CPU on
# 2 cores (a Prefect server with its UI, PostgreSQL and Redis, a worker installing the wheel, make serve in a terminal,
# Chromium). What each exercises, the quick suite exercises in its parts; CI (.ci/run) runs both. A key is a test's id
# or a whole file.
LONG: dict[str, str] = {
    "tests/test_cli.py::test_the_demo_writes_its_target_file_and_says_how_to_check_it": "`relaunch demo` as typed, whole",
    "tests/test_deployments.py": "prefect.yaml's deployments on `make serve`'s server and worker",
    "tests/test_deploy.py": "`relaunch deploy` to a worker that has only the wheel",
    "tests/test_scale_concurrency.py": "the scale-out engine: PostgreSQL, Redis, an authenticated server, two workers",
    "tests/test_scale_demo.py": "`make scale-demo` as typed",
    "tests/test_serve_terminal.py": "`make serve` in a real terminal, Ctrl-C",
    "tests/test_ui.py": "the Prefect UI in headless Chromium",
    "tests/test_gang_demo.py": "`relaunch demo --scenario multi-node` as typed",
    "tests/test_wheel.py": "the built wheel installed into a fresh venv",
    "tests/test_gang.py": "a two-host gang in network namespaces, torchrun across them",
    "tests/test_multirank.py": "torchrun's ranks killed, hung and left running, on real processes",
    "tests/test_notifications.py": "a Prefect server's automations and the nightly deployment's schedule",
    "tests/test_temp_server.py": "the CLI's temporary Prefect server started, killed and refused, a server each",
    "tests/test_never_harm_gaps.py::test_the_rows_that_write_the_kernel_log_fail_under_ci_where_dev_kmsg_is_not_writable_and_skip_elsewhere": (
        "two never-harm rows again in a pytest of their own, in a mount namespace"
    ),
}


class _LongMarks:
    """A plugin of its own: a conftest holds one function per hook name, and the dealing below must run last."""

    @pytest.hookimpl(tryfirst=True)  # before -m deselects
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if item.nodeid in LONG or item.nodeid.split("::", 1)[0] in LONG:
                item.add_marker(pytest.mark.long)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_LongMarks(), "relaunch-long-marks")


def _unit(item: pytest.Item) -> str | None:
    """The LONGEST key an item belongs to: its own id, or its file's."""
    if item.nodeid in LONGEST:
        return item.nodeid
    path = item.nodeid.split("::", 1)[0]
    return path if path in LONGEST else None


@pytest.hookimpl(trylast=True)  # after -m has deselected: the shares are of the tests that run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deal the longest tests round the xdist workers, each at the head of the share the worker is given first, the longest
    to the least loaded (worksteal splits the collected list into equal consecutive shares). Every worker collects the same order."""
    workers = int(getattr(config.option, "numprocesses", None) or 0)
    if workers < 2:
        return
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        if (key := _unit(item)) is not None:
            units.setdefault(key, []).append(item)
    # Longest first, each to the worker with the least so far (so no worker's head holds much more than another's).
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for key in sorted(units, key=lambda k: -LONGEST[k]):
        w = load.index(min(load))
        heads[w] += units[key]
        load[w] += LONGEST[key]
    rest = iter([i for i in items if _unit(i) is None])
    share = -(-len(items) // workers)
    dealt: list[pytest.Item] = []
    for w in range(workers):
        dealt += heads[w] + [i for _, i in zip(range(share - len(heads[w])), rest)]
    items[:] = dealt + list(rest)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--under-load",
        action="store_true",
        default=False,
        help="Run every test with every core busy (tests/load.py: one CPU hog per core for the session).",
    )


@pytest.fixture(scope="session", autouse=True)
def _under_load(request: pytest.FixtureRequest):
    """`--under-load`: the whole session runs beside one CPU hog per core (each xdist worker starts its own)."""
    if not request.config.getoption("--under-load"):
        yield
        return
    from tests.load import cpu_hogs

    with cpu_hogs():
        yield


@pytest.fixture
def cpu_hogs():
    """One CPU hog per core for this test's duration, killed after by PID: the verdict must not change under load."""
    from tests.load import cpu_hogs as hogs

    with hogs() as pids:
        yield pids
