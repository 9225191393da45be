"""check-fleet across hosts of their own: each in its own network namespace, with its own address and sshd.

Host i answers at 10.213.i.2 (relaunch/testing/netns.py); its sessions, and the trainers they launch, run on this machine's
file system and process table, with a tmux server per host. Taking a host's link down is a host that vanished:
nothing answers it any more, neither on the open connection nor on a new one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from relaunch.config import Target
from relaunch.errors import HostUnreachable, TransportError
from relaunch.flows.fleet import check_fleet
from relaunch.tasks.health import check_health, collect_snapshot
from relaunch.tasks.launch import launch
from relaunch.testing.netns import Fleet, fleet_of_hosts
from relaunch.testing.targets import current, runs, shell_target, stop_all, wait_for_exit
from relaunch.vocabulary import Verdict
from relaunch.wire.commands import Command
from relaunch.wire.transport import close_all, run, transport_for

pytestmark = pytest.mark.usefixtures("prefect_harness")

CONNECT_TIMEOUT = 3.0
COMMAND_TIMEOUT = 20.0


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """Three hosts, each in its own namespace with its own sshd; no connection carried in or out of the test."""
    close_all()
    with fleet_of_hosts(3, tmp_path / "hosts") as hosts:
        try:
            yield hosts
        finally:
            close_all()


def targets_on(fleet: Fleet, tmp_path: Path) -> list[Target]:
    """One shell target per host, with small connect and command limits."""
    return [
        shell_target(
            tmp_path / f"host{i}",
            name=f"host{i}",
            host=server.ssh_host(connect_timeout_seconds=CONNECT_TIMEOUT, command_timeout_seconds=COMMAND_TIMEOUT),
        )
        for i, server in enumerate(fleet.servers)
    ]


@contextmanager
def stopping(fleet: Fleet, targets: list[Target]) -> Iterator[None]:
    """Every trainer stopped at the end, failing test or not: hosts taken away come back first, so the stop reaches them."""
    try:
        yield
    finally:
        for i in sorted(fleet.net.gone):
            fleet.up(i)
        stop_all(*targets)


def logins(fleet: Fleet) -> list[int]:
    return [server.accepted_logins() for server in fleet.servers]


def test_a_fleet_of_three_hosts_recovers_only_the_crashed_host_and_reaches_each_host_on_one_connection_of_its_own(tmp_path, fleet: Fleet):
    targets = targets_on(fleet, tmp_path)
    sick, healthy = targets[1], [targets[0], targets[2]]
    with stopping(fleet, targets):
        before = {t.name: launch.fn(t, 1)[0].run_id for t in healthy}
        # Crashes for real (exit 3 at step 2); the relaunch, without the fault's environment, keeps running.
        launch.fn(sick.model_copy(update={"env": {"EXIT_AT": "2", "EXIT_CODE": "3"}}), 1)
        wait_for_exit(sick)
        close_all()  # the fleet run makes its own connections
        start = logins(fleet)
        fleet_report = check_fleet(targets, recover=True, max_concurrent=3)
        new_logins = [n - s for n, s in zip(logins(fleet), start)]
        alive = {t.name: collect_snapshot(t).pid_alive for t in targets}
    rows = {r.target: r for r in fleet_report.rows}
    assert [r.host for r in fleet_report.rows] == [f"root@{h.address}:{s.port}" for h, s in zip(fleet.net.hosts, fleet.servers)]
    assert rows[sick.name].found is Verdict.CRASHED and rows[sick.name].recovered, rows[sick.name]
    assert rows[sick.name].verdict is Verdict.HEALTHY and rows[sick.name].ok, rows[sick.name]
    assert len(runs(sick)) == 2, "the crashed run was relaunched once, on its own host"
    for t in healthy:
        assert rows[t.name].found is Verdict.HEALTHY and not rows[t.name].recovered, rows[t.name]
        assert runs(t) == [before[t.name]] and current(t) == before[t.name], "a healthy run is left untouched"
    assert all(alive.values()), alive
    assert new_logins == [1, 1, 1], "every check, poll and recovery step on a host shared that host's one connection"
    for host, server in zip(fleet.net.hosts, fleet.servers):
        # Each sshd saw us come from its own link, not through loopback: the hosts really are apart.
        assert f"Accepted publickey for root from {host.gateway} " in server.log_path.read_text(), server.log_path.read_text()[-2000:]


def test_a_host_that_goes_away_mid_run_is_an_unreachable_row_that_does_not_hold_up_the_fleet_and_is_healthy_once_back(
    tmp_path, fleet: Fleet
):
    targets = targets_on(fleet, tmp_path)
    gone = targets[2]
    with stopping(fleet, targets):
        before = {t.name: launch.fn(t, 1)[0].run_id for t in targets}
        connections = [transport_for(t.host).connection for t in targets]  # type: ignore[attr-defined]
        assert all(c is not None and c.is_connected for c in connections), "the launches left each host's connection open"
        fleet.down(2)  # host 2 vanishes between two checks: its connection is open, and nothing answers on it
        outage_state = check_fleet(targets, recover=False, max_concurrent=3, return_state=True)
        outage = outage_state.result(raise_on_failure=False)
        fleet.up(2)
        start = logins(fleet)
        back = check_fleet(targets, recover=False, max_concurrent=3)
        new_logins = [n - s for n, s in zip(logins(fleet), start)]
    assert outage_state.is_failed() and "1 of 3 targets not healthy" in outage_state.message, "an unreachable host fails the fleet run"
    row = outage.rows[2]
    address = f"{fleet.net.hosts[2].address}:{fleet.servers[2].port}"
    assert row.found is None and row.verdict is None and not row.ok and not row.recovered, row
    assert row.message.startswith(f"check failed: {HostUnreachable.__name__}: on root@{address}: cannot run `health poll`"), row.message
    assert [(r.found, r.ok) for r in outage.rows[:2]] == [(Verdict.HEALTHY, True)] * 2, outage.rows[:2]
    # Each attempt (the check, then Prefect's retries) gives up within the connect timeout: the open connection's next
    # channel, then new connections (~19 s in all here). Waiting out a poll's own limit would take 75 s per attempt.
    retry_delays = sum(check_health.retry_delay_seconds[: check_health.retries])
    bound = (check_health.retries + 1) * CONNECT_TIMEOUT + retry_delays + 8
    assert outage.check_phase_seconds < bound, outage.summary()
    assert [(r.found, r.ok, r.recovered) for r in back.rows] == [(Verdict.HEALTHY, True, False)] * 3, back.rows
    assert new_logins == [0, 0, 1], "the healthy hosts kept their connections; host 2 was reached again on a new one"
    assert current(gone) == before[gone.name] and runs(gone) == [before[gone.name]], "host 2's trainer ran on through the outage"


def test_a_command_in_flight_when_its_host_goes_away_fails_as_a_lost_connection_within_a_few_connect_timeouts(tmp_path, fleet: Fleet):
    host = fleet.servers[0].ssh_host(connect_timeout_seconds=CONNECT_TIMEOUT, command_timeout_seconds=COMMAND_TIMEOUT)
    transport = transport_for(host)
    started = tmp_path / "started"
    outcome: list[BaseException | None] = []

    def long_step() -> None:
        try:
            run(transport, Command(("bash", "-c", f"touch {started}; sleep 30"), label="long step"))
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=long_step, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not started.exists():
            assert time.monotonic() < deadline, "the long step never started on the host"
            time.sleep(0.02)
        fleet.down(0)
        thread.join(timeout=4 * CONNECT_TIMEOUT)
        assert not thread.is_alive(), f"still waiting {4 * CONNECT_TIMEOUT:g} s after the host went away"
    finally:
        fleet.up(0)
        close_all()  # ends a command still waiting on the dead connection
        thread.join(timeout=10)
    (error,) = outcome
    assert isinstance(error, TransportError) and "connection" in error.reason and "stopped on the host" not in error.reason, error
