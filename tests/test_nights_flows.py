"""Across nights on a real (temporary) Prefect server: the history and the GPU ledger live in its Variables, so the
nights below are real recover-training runs, each reading what the earlier ones wrote.

GPU faults cannot happen here: the kernel's Xid lines and the trainer's CUDA error are public captures
(tests/fixtures/logs/xid/PROVENANCE.md), printed by the `dmesg` and `nvidia-smi` stand-ins of tests/test_fleet_failures.py.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from relaunch.deciding.ledger import Ledger
from relaunch.flows.check import check_training
from relaunch.flows.fleet import check_fleet
from relaunch.flows.recover import recover_training
from relaunch.tasks.health import collect_snapshot
from relaunch.tasks.launch import launch
from relaunch.tasks.memory import history_variable, read_ledger, write_ledger
from relaunch.testing.faults import RELAUNCH, ROOT, cli_env, wait_for
from relaunch.testing.netns import Fleet, fleet_of_hosts
from relaunch.testing.targets import runs, shell_target, stop_all, wait_for_exit
from relaunch.vocabulary import Action, Cause, Verdict
from relaunch.wire.transport import close_all
from tests.test_fleet_failures import XID, dmesg_printing, host_commands, launched_and_exited, made, recover, told, trainer  # noqa: F401
from tests.test_netns_fleet import fleet, stopping, targets_on  # noqa: F401

pytestmark = pytest.mark.usefixtures("prefect_harness")

# Fails as a process on a failed GPU does ($1: a public capture) when it is given GPU 0; steps on any other GPU, and
# fails the same way there once the file $2 (when given) is there.
GPU0_FAILS = """#!/usr/bin/env bash
if [ "$CUDA_VISIBLE_DEVICES" = 0 ]; then
  for i in 1 2 3; do echo "step=$i loss=3.6441 acc=0.097 lr=3.96e-04 | dft=0.50b/s (20.0Ktok/s)"; done
  cat -- "$1"
  exit 1
fi
for i in $(seq 1 100000); do
  echo "step=$i loss=3.6441 acc=0.097 lr=3.96e-04 | dft=0.50b/s (20.0Ktok/s)"
  [ -n "$2" ] && [ -e "$2" ] && { cat -- "$1"; exit 1; }
  sleep 0.2
done
"""


def client():
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def test_a_crash_that_returns_a_third_night_from_the_same_checkpoint_is_a_restart_storm_escalated_not_relaunched(tmp_path):
    target = shell_target(tmp_path, name="stormy")
    # Each night the run crashes for real (exit 3 at step 2); each recovery relaunches it without the fault, healthy.
    crashing = target.model_copy(update={"env": {"EXIT_AT": "2", "EXIT_CODE": "3"}})
    nights = []
    try:
        for _ in range(3):
            stop_all(target)
            launch.fn(crashing, 1)
            wait_for_exit(target)
            state = recover_training(target, return_state=True)
            nights.append((state, state.result(raise_on_failure=False)))
    finally:
        stop_all(target)
    (first, one), (_, two), (third, three) = nights
    assert one.ok and two.ok and first.is_completed(), "two nights recovered"
    storm = three.attempts[0]
    assert (storm.verdict, storm.action) == (Verdict.CRASHED, Action.ESCALATE) and len(three.attempts) == 1, told(three)
    assert storm.why.startswith(f"restart storm: crashed/{storm.cause.value} returned 3 times within 72 h, each time from no checkpoint")
    assert third.is_failed() and "restart storm" in third.message, third.message
    assert len(runs(target)) == 5, "3 crashed launches and 2 relaunches: none on the third night"
    with client() as c:
        saved = c.read_variable_by_name(history_variable(target)).value
    assert [n["ended"] for n in saved["nights"]] == ["healthy", "healthy", "crashed"], saved
    assert [n["action"] for n in saved["nights"]][-1] == "escalate"


@pytest.fixture
def empty_ledger():
    """This machine's ledger empty before and after: every local target shares it (other tests' GPU faults land there)."""
    with client() as c:
        write_ledger(c, Ledger(host="localhost"))
    yield
    with client() as c:
        write_ledger(c, Ledger(host="localhost"))


@pytest.mark.usefixtures("empty_ledger")
def test_a_gpu_that_failed_is_ledgered_swapped_for_the_spare_and_never_given_back_to_a_later_relaunch(made, tmp_path, monkeypatch):  # noqa: F811
    host_commands(tmp_path / "bin", monkeypatch, dmesg_printing(XID / "xid79_journal.txt"), nvidia_smi=True)
    command = f"bash {trainer(tmp_path, 'gpu0_fails.sh', GPU0_FAILS)} {XID / 'cuda_unspecified_launch_failure.log'}"
    t = made(launch_command=command, env={"CUDA_VISIBLE_DEVICES": "0"}, spare_gpus=[1])
    launched_and_exited(t)
    night1 = recover(t)
    first = night1.attempts[0]
    assert (first.verdict, first.cause, first.action) == (Verdict.CRASHED, Cause.GPU_FAULT, Action.RELAUNCH), told(night1)
    assert "relaunched on GPUs 1 (swapped for spare GPU(s) 1; CUDA_VISIBLE_DEVICES set)" in first.why, told(night1)
    assert night1.ok and night1.verdict is Verdict.HEALTHY, "the trainer steps on GPU 1: " + told(night1)
    with client() as c:
        (entry,) = read_ledger(c, t.host.hostname).gpus
    assert (entry.bus_id, entry.index, entry.uuid) == ("00000000:00:06.0", 0, "GPU-b30686fb-50e5-b296-a563-b7746cd0b24a")

    # The next night: the kernel says nothing any more, the run on GPU 0 dies of a plain CUDA error, and no spare is left.
    for tool in ("dmesg", "nvidia-smi"):
        (tmp_path / "bin" / tool).unlink()
    stop_all(t)
    no_spare = t.model_copy(update={"spare_gpus": []})
    launched_and_exited(no_spare)
    state = recover_training(no_spare, return_state=True)
    night2 = state.result(raise_on_failure=False)
    last = night2.attempts[0]
    assert last.cause is not Cause.GPU_FAULT and last.action is Action.ESCALATE, told(night2)
    assert "GPU 0 (PCI 00000000:00:06.0, GPU-b30686fb-50e5-b296-a563-b7746cd0b24a, serial 0) in the GPU ledger" in last.why
    assert state.is_failed() and "never given back to a relaunch" in state.message, state.message
    assert len(runs(t)) == 3, "night 1: the failed launch and the relaunch on the spare; night 2: the crashed launch only"

    from prefect.settings import PREFECT_API_URL

    env = cli_env(tmp_path / "cli-home", PREFECT_API_URL.value())
    listed = subprocess.run([RELAUNCH, "gpus", "--json"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert [(r["host"], r["bus_id"], r["times"]) for r in json.loads(listed.stdout)] == [(t.host.hostname, "00000000:00:06.0", 1)]
    cleared = subprocess.run(
        [RELAUNCH, "gpus", "clear", t.host.hostname, "0000:00:06"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert cleared.returncode == 0 and cleared.stdout.startswith("cleared GPU 0 (PCI 00000000:00:06.0"), cleared.stdout + cleared.stderr
    with client() as c:
        assert read_ledger(c, t.host.hostname).gpus == []


@pytest.mark.usefixtures("empty_ledger")
def test_the_nightly_check_judges_a_run_on_the_gpus_its_recovery_placed_it_on_not_the_ledgered_one_of_its_settings(
    made,
    tmp_path,
    monkeypatch,  # noqa: F811
):
    # The kernel keeps GPU 0's Xid 79 in its ring buffer for the whole test: it is about GPU 0 only (PCI 00:06).
    host_commands(tmp_path / "bin", monkeypatch, dmesg_printing(XID / "xid79_journal.txt"), nvidia_smi=True)
    gate = tmp_path / "crash-now"
    command = f"bash {trainer(tmp_path, 'gpu0_fails.sh', GPU0_FAILS)} {XID / 'cuda_unspecified_launch_failure.log'} {gate}"
    t = made(launch_command=command, env={"CUDA_VISIBLE_DEVICES": "0"}, spare_gpus=[1])
    launched_and_exited(t)
    night1 = recover(t)
    assert night1.ok and "relaunched on GPUs 1" in night1.attempts[0].why, told(night1)

    # The next day the run on GPU 1 dies of a CUDA error of its own; GPU 0's old Xid is another GPU's business.
    gate.touch()
    wait_for_exit(t, 60)
    state = check_training(t, return_state=True)
    report = state.result(raise_on_failure=False)
    (first,) = report.attempts
    assert first.verdict is Verdict.CRASHED and first.cause is not Cause.GPU_FAULT, told(report)
    assert not any("00:06" in line or "Xid" in line for line in first.evidence), told(report)


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[Fleet]:
    """Two hosts, each in its own network namespace with its own sshd (relaunch/testing/netns.py)."""
    close_all()
    with fleet_of_hosts(2, tmp_path / "hosts") as hosts:
        try:
            yield hosts
        finally:
            close_all()


def incident_events(since: datetime) -> list:
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter

    with client() as c:
        return c.read_events(
            filter=EventFilter(event=EventNameFilter(name=["relaunch.fleet.incident"]), occurred=EventOccurredFilter(since=since)),
            limit=50,  # the server's page; the client asks 100 by default
        ).events


def test_one_crash_on_two_hosts_at_once_is_one_incident_and_the_second_recovery_is_held_when_the_first_does_not_heal(
    tmp_path, two_hosts: Fleet
):
    # Both hosts' runs crash the same way within seconds, and their relaunch would crash again: the first recovery escalates.
    targets = [t.model_copy(update={"env": {"EXIT_AT": "2", "EXIT_CODE": "3"}}) for t in targets_on(two_hosts, tmp_path)]
    since = datetime.now(UTC)
    with stopping(two_hosts, targets):
        for t in targets:
            launch.fn(t, 1)
        for t in targets:
            wait_for_exit(t)
        close_all()  # the fleet run makes its own connections
        state = check_fleet(targets, recover=True, max_concurrent=2, return_state=True)
        fleet = state.result(raise_on_failure=False)
        launches = [len(runs(t)) for t in targets]
    hosts = [h.address for h in two_hosts.net.hosts]
    (incident,) = fleet.incidents
    assert incident.startswith(f"one incident: crashed/error on 2 hosts ({hosts[0]}, {hosts[1]}) within "), incident
    first, second = fleet.rows
    assert first.recovered and not first.ok and first.incident == second.incident == "crashed/error", first
    assert not second.recovered and second.message.startswith("held: one incident: crashed/error on 2 hosts"), second
    # The first host is relaunched until the playbook escalates (once, or more where a loaded machine let the relaunch
    # step further before it died: seen [4, 1] in a fresh-clone `make test`); the second is never touched.
    assert launches[0] >= 2 and launches[1] == 1, f"{launches}: the first host relaunched, the second never touched"
    assert state.is_failed() and "2 of 2 targets not healthy" in state.message
    (event,) = wait_for(lambda: incident_events(since), 30, "the incident's event on the server")
    assert event.resource["relaunch.hosts"] == ",".join(hosts) and event.resource["relaunch.targets"] == "host0,host1", event


def test_two_hosts_cut_off_at_once_are_one_partition_incident_untouched_while_the_crashed_trainer_of_a_third_is_recovered(
    tmp_path, fleet: Fleet
):
    targets = targets_on(fleet, tmp_path)
    sick = targets[2]
    since = datetime.now(UTC)
    with stopping(fleet, targets):
        before = {t.name: launch.fn(t, 1)[0].run_id for t in targets[:2]}
        # Crashes for real (exit 3 at step 2); the relaunch, without the fault's environment, keeps running.
        launch.fn(sick.model_copy(update={"env": {"EXIT_AT": "2", "EXIT_CODE": "3"}}), 1)
        wait_for_exit(sick)
        fleet.down(0)
        fleet.down(1)
        state = check_fleet(targets, recover=True, max_concurrent=3, return_state=True)
        report = state.result(raise_on_failure=False)
        for i in (0, 1):
            fleet.up(i)
        alive = [collect_snapshot(t).pid_alive for t in targets[:2]]
        launches = {t.name: runs(t) for t in targets}
    hosts = [h.address for h in fleet.net.hosts]
    (incident,) = report.incidents
    assert incident.startswith(f"one incident: unreachable on 2 hosts ({hosts[0]}, {hosts[1]}) within "), incident
    assert "nothing is stopped or launched on them" in incident
    cut, recovered = report.rows[:2], report.rows[2]
    assert [(r.incident, r.found, r.recovered) for r in cut] == [("unreachable", None, False)] * 2, cut
    assert all(r.message.startswith(("check failed: TransportError: on root@", "check failed: HostUnreachable: on root@")) for r in cut), [
        r.message for r in cut
    ]
    assert (recovered.found, recovered.recovered, recovered.verdict, recovered.incident) == (Verdict.CRASHED, True, Verdict.HEALTHY, None)
    assert [launches[t.name] for t in targets[:2]] == [[before[t.name]] for t in targets[:2]] and alive == [True, True], (
        "nothing was stopped or launched on the hosts cut off: their trainers ran on through it"
    )
    assert len(launches[sick.name]) == 2, "the crashed run was relaunched once, on its own host"
    assert state.is_failed() and "2 of 3 targets not healthy" in state.message and incident in state.message, state.message
    (event,) = wait_for(lambda: incident_events(since), 30, "the incident's event on the server")
    assert event.resource["relaunch.hosts"] == f"{hosts[0]},{hosts[1]}" and event.resource["relaunch.verdict"] == "unreachable", event
    assert event.resource["relaunch.targets"] == "host0,host1", event
