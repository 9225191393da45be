"""A host behind a bastion (`Host.jump`), in network namespaces: the target is linked only to the bastion's namespace.

    this machine --10.213.s.0/24-- bastion (its own sshd) --10.214.s.0/24-- target (its own sshd)

This machine has no route to the target; only the bastion's sshd, forwarding a direct-tcpip channel, reaches it
(relaunch/testing/netns.py `behind_bastion`). Every hop has its own host key, user key and known_hosts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relaunch.config import Host
from relaunch.errors import AuthenticationFailed, HostKeyError, HostUnreachable, TransportError, is_transient
from relaunch.testing.faults import wait_for
from relaunch.testing.netns import BehindBastion, behind_bastion
from relaunch.testing.sshd import keygen
from relaunch.wire.commands import Command
from relaunch.wire.ssh import SSHTransport

CONNECT_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def route(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BehindBastion]:
    with behind_bastion(tmp_path_factory.mktemp("jump")) as topology:
        yield topology


def target(route: BehindBastion, **overrides: object) -> Host:
    return route.target_host(connect_timeout_seconds=CONNECT_TIMEOUT, command_timeout_seconds=30.0, **overrides)


def bastion_address(route: BehindBastion) -> str:
    return f"root@{route.bastion.net.hosts[0].address}:{route.bastion_server.port}"


def target_address(route: BehindBastion) -> str:
    return f"root@{route.inner.address}:{route.target.port}"


def connect_error(host: Host) -> BaseException:
    """What the first command on a fresh transport raises."""
    transport = SSHTransport(host)
    try:
        transport.execute(Command(("true",), label="probe"))
    except Exception as exc:  # noqa: BLE001 - handed to the test
        return exc
    finally:
        transport.close()
    raise AssertionError(f"{host.label}: the command ran, an error was expected")


def logins(route: BehindBastion) -> tuple[int, int]:
    return route.bastion_server.accepted_logins(), route.target.accepted_logins()


def test_a_command_runs_on_the_host_behind_the_bastion_and_every_command_shares_one_route(route: BehindBastion) -> None:
    host = target(route)
    assert host.label == f"{target_address(route)} via {bastion_address(route)}"
    before = logins(route)
    transport = SSHTransport(host)
    try:
        addresses = transport.execute(Command(("ip", "-4", "-o", "addr", "show"))).stdout
        for i in range(5):
            assert transport.execute(Command(("echo", str(i)))).stdout == f"{i}\n"
    finally:
        transport.close()
    assert f"inet {route.inner.address}/24" in addresses and route.bastion.net.hosts[0].address not in addresses, (
        "the command ran in the target's namespace"
    )
    assert [n - b for n, b in zip(logins(route), before)] == [1, 1], "one login on each hop for six commands"
    # The target saw us come from the bastion's end of its only link.
    assert f"Accepted publickey for root from {route.inner.gateway} " in route.target.log_path.read_text()


def test_the_host_behind_the_bastion_cannot_be_reached_directly(route: BehindBastion) -> None:
    direct = target(route, jump=[])
    error = connect_error(direct)
    # Never reached before: an answer (nothing ran there), said at once, not retried.
    assert isinstance(error, HostUnreachable) and not is_transient(error), repr(error)
    assert str(error).startswith(f"on {target_address(route)}: cannot run `probe`: "), str(error)


@pytest.mark.parametrize("trust_on_first_use", [False, True])
def test_a_changed_host_key_on_the_bastion_is_refused_naming_the_bastion(
    route: BehindBastion, tmp_path: Path, trust_on_first_use: bool
) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(route.bastion_server.known_hosts_line(keygen(tmp_path / "impostor").with_suffix(".pub")))
    bastion = route.bastion_server.jump_host(known_hosts_path=str(known_hosts), trust_on_first_use=trust_on_first_use)
    before = logins(route)
    error = connect_error(target(route, jump=[bastion]))
    assert isinstance(error, HostKeyError) and not is_transient(error), repr(error)
    text = str(error)
    assert text.startswith(f"jump host {bastion_address(route)} (hop 1 of 1 on the way to {target_address(route)}): host key CHANGED"), text
    assert "man-in-the-middle" in text and f"ssh-keygen -R '[{route.bastion.net.hosts[0].address}]:{route.bastion_server.port}'" in text
    assert logins(route) == before, "neither hop was logged into"


def test_an_unknown_host_key_on_the_bastion_is_refused_naming_the_bastion_and_how_to_record_it(
    route: BehindBastion, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    error = connect_error(target(route, jump=[route.bastion_server.jump_host(known_hosts_path=str(known_hosts))]))
    assert isinstance(error, HostKeyError), repr(error)
    text = str(error)
    bastion_ip, port = route.bastion.net.hosts[0].address, route.bastion_server.port
    assert text.startswith(f"jump host {bastion_address(route)} (hop 1 of 1 on the way to {target_address(route)}): unknown host key"), text
    assert f"run `ssh-keyscan -p {port} {bastion_ip} >> {known_hosts}`" in text and "trust_on_first_use: true on this jump host" in text
    assert known_hosts.read_text() == ""


@pytest.mark.parametrize("trust_on_first_use", [False, True])
def test_a_changed_host_key_on_the_target_is_refused_naming_the_target_and_its_bastion(
    route: BehindBastion, tmp_path: Path, trust_on_first_use: bool
) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(route.target.known_hosts_line(keygen(tmp_path / "impostor").with_suffix(".pub")))
    before = logins(route)
    error = connect_error(target(route, known_hosts_path=str(known_hosts), trust_on_first_use=trust_on_first_use))
    assert isinstance(error, HostKeyError) and not is_transient(error), repr(error)
    text = str(error)
    assert text.startswith(f"{target_address(route)} via {bastion_address(route)}: host key CHANGED"), text
    assert [n - b for n, b in zip(logins(route), before)] == [1, 0], "the bastion let us through; the target was never logged into"


def test_an_unknown_host_key_on_the_target_is_refused_and_the_scan_is_to_be_run_on_the_bastion(
    route: BehindBastion, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "known_hosts"
    error = connect_error(target(route, known_hosts_path=str(known_hosts)))
    assert isinstance(error, HostKeyError), repr(error)
    text = str(error)
    assert text.startswith(f"{target_address(route)} via {bastion_address(route)}: unknown host key"), text
    assert (
        f"run `ssh-keyscan -p {route.target.port} {route.inner.address}` on {bastion_address(route)} "
        f"(this hop is reachable only from there) and append its output to {known_hosts}"
    ) in text
    assert not known_hosts.exists()


def test_trust_on_first_use_records_the_targets_key_as_seen_through_the_bastion(route: BehindBastion, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    first = SSHTransport(target(route, known_hosts_path=str(known_hosts), trust_on_first_use=True))
    try:
        assert first.execute(Command(("true",))).exit_code == 0
    finally:
        first.close()
    assert known_hosts.read_text() == route.target.known_hosts_line(), "the target's own key, under its own address"
    strict = SSHTransport(target(route, known_hosts_path=str(known_hosts)))
    try:
        assert strict.execute(Command(("echo", "known"))).stdout == "known\n"
    finally:
        strict.close()


def test_a_wrong_key_for_the_bastion_fails_authentication_naming_the_bastion(route: BehindBastion, tmp_path: Path) -> None:
    stranger = keygen(tmp_path / "stranger")
    error = connect_error(target(route, jump=[route.bastion_server.jump_host(key_path=str(stranger))]))
    assert isinstance(error, AuthenticationFailed) and not is_transient(error), repr(error)
    text = str(error)
    assert text.startswith(
        f"jump host {bastion_address(route)} (hop 1 of 1 on the way to {target_address(route)}): authentication failed"
    ), text
    assert f"with key {stranger}" in text and f"authorized_keys on {route.bastion.net.hosts[0].address}" in text


def test_a_target_port_the_bastion_cannot_reach_is_an_unreachable_host_naming_the_bastion_and_the_tunnel(route: BehindBastion) -> None:
    error = connect_error(target(route, port=1))
    assert isinstance(error, HostUnreachable) and not is_transient(error), repr(error)
    assert (
        error.reason
        == f"jump host {bastion_address(route)} cannot open a tunnel to {route.inner.address}:1: Connect failed (channel open failure 2)"
    )
    assert f"reachable from {bastion_address(route)}, and that sshd listens on port 1" in error.advice


def test_a_dropped_bastion_link_fails_the_command_in_flight_as_transient_and_the_route_is_rebuilt_once_it_is_back(
    route: BehindBastion, tmp_path: Path
) -> None:
    transport = SSHTransport(target(route))
    started = tmp_path / "started"  # the namespaces share this machine's file system
    outcome: list[BaseException | None] = []

    def long_step() -> None:
        try:
            transport.execute(Command(("bash", "-c", 'touch "$1"; exec sleep 30', "-", str(started)), label="long step"))
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=long_step, daemon=True)
    try:
        transport.execute(Command(("true",)))
        before = logins(route)
        thread.start()
        wait_for(started.exists, 20, "the long step to start on the target")
        start = time.monotonic()
        route.down()
        thread.join(timeout=5 * CONNECT_TIMEOUT)
        assert not thread.is_alive(), f"still waiting {5 * CONNECT_TIMEOUT:g} s after the bastion's link went down"
        noticed = time.monotonic() - start
        route.up()
        assert transport.execute(Command(("echo", "back"))).stdout == "back\n"
        after = logins(route)
    finally:
        route.up()  # a no-op when it is up already
        transport.close()  # ends a command still waiting on the dead route
        thread.join(timeout=10)
    (error,) = outcome
    assert isinstance(error, TransportError) and is_transient(error), repr(error)
    assert error.host == f"{target_address(route)} via {bastion_address(route)}" and error.command == "long step", error
    assert "connection" in error.reason and "stopped on the host" not in error.reason, error.reason
    assert [a - b for a, b in zip(after, before)] == [1, 1], "the whole route was built again: one new login on each hop"
    print(f"\nthe dropped bastion link was noticed after {noticed:.1f} s (connect timeout {CONNECT_TIMEOUT:g} s)")


def test_a_jump_host_is_only_for_ssh_hosts_and_refuses_control_characters_like_the_host() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="jump is set but kind is not ssh"):
        Host(kind="local", jump=[{"hostname": "bastion"}])
    with pytest.raises(ValidationError) as bad:
        Host(kind="ssh", hostname="t", jump=[{"hostname": "bastion\nProxyCommand x"}])
    assert bad.value.errors()[0]["loc"] == ("jump", 0, "hostname") and "control characters" in str(bad.value)
