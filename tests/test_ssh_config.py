"""SSH as the user has it (`host.ssh_config: true`): a host named by its ~/.ssh/config alias.

The end-to-end tests reach a host behind a bastion in network namespaces (relaunch/testing/netns.py `behind_bastion`: this
machine has no route to the target) through nothing but an alias: HOME is a temporary folder whose .ssh/config
gives HostName, User, Port, IdentityFile, UserKnownHostsFile and ProxyJump; the target's key is in a real ssh-agent,
the bastion's key is encrypted, its passphrase in the Secret block named after its alias. The pure tests read config
texts with paramiko's own parser.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from relaunch.cli.doctor import examine
from relaunch.config import Host
from relaunch.errors import ConfigError
from relaunch.plans.doctor import Status, passed
from relaunch.testing.faults import wait_for
from relaunch.testing.netns import BehindBastion, behind_bastion
from relaunch.testing.sshd import keygen
from relaunch.testing.targets import shell_target
from relaunch.wire.commands import Command
from relaunch.wire.ssh import PASSPHRASE_ENV, SSHTransport
from relaunch.wire.sshconfig import passphrase_block, resolve

CONFIG = """\
Host gpu-box
  HostName 10.0.0.5
  User trainer
  Port 2222
  IdentityFile {key}
  IdentityFile ~/.ssh/absent
  UserKnownHostsFile ~/.ssh/known_hosts_gpu ~/.ssh/other
  ProxyJump bastion,ops@edge:2200

Host bastion
  HostName 203.0.113.7
  User jump

Host edge
  HostName 198.51.100.9
  Port 22
  User edge-user
"""


def parsed(text: str) -> paramiko.SSHConfig:
    return paramiko.SSHConfig.from_text(text)


def test_an_alias_takes_hostname_user_port_key_known_hosts_and_the_proxyjump_chain_from_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    key = keygen(tmp_path / "id_gpu")
    resolved = resolve(Host(kind="ssh", hostname="gpu-box", ssh_config=True), parsed(CONFIG.format(key=key)))
    host = resolved.host
    assert (host.hostname, host.user, host.port, host.key_path) == ("10.0.0.5", "trainer", 2222, str(key))
    assert host.known_hosts_path == f"{tmp_path}/.ssh/known_hosts_gpu"
    assert [j.address for j in host.jump] == ["jump@203.0.113.7:22", "ops@198.51.100.9:2200"], "the entry's user and port win"
    assert resolved.aliases == ["bastion", "edge", "gpu-box"]
    assert passphrase_block("Edge.Example") == "ssh-passphrase-edge-example"


def test_fields_the_target_sets_win_over_the_config_and_without_ssh_config_it_is_not_read(tmp_path: Path) -> None:
    config = parsed(CONFIG.format(key=tmp_path / "none"))
    host = Host(kind="ssh", hostname="gpu-box", ssh_config=True, user="me", port=22, jump=[])
    resolved = resolve(host, config).host
    assert (resolved.hostname, resolved.user, resolved.port, resolved.jump) == ("10.0.0.5", "me", 22, [])
    assert resolved.key_path is None, "no IdentityFile exists: the agent and default keys"
    listed = resolve(Host(kind="ssh", hostname="gpu-box", ssh_config=True, jump=[{"hostname": "b.example"}]), config)
    assert [j.hostname for j in listed.host.jump] == ["b.example"] and listed.aliases == ["b.example", "gpu-box"], "one alias per hop"
    off = Host(kind="ssh", hostname="gpu-box")
    assert resolve(off, config).host == off


def test_a_proxycommand_is_refused_naming_proxyjump_and_ssh_config_needs_an_ssh_host() -> None:
    with pytest.raises(ConfigError, match="uses ProxyCommand.*use ProxyJump"):
        resolve(Host(kind="ssh", hostname="x", ssh_config=True), parsed("Host x\n  ProxyCommand nc %h %p\n"))
    with pytest.raises(ValueError, match="ssh_config is on but kind is not ssh"):
        Host(hostname="x", ssh_config=True)


# -------------------------------------------------------------------------------------------------
# End to end, over the network-namespace hosts.


@pytest.fixture(scope="module")
def route(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BehindBastion]:
    with behind_bastion(tmp_path_factory.mktemp("sshconfig")) as topology:
        yield topology


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A real ssh-agent of this test's own (its socket in tmp_path), ended by its PID."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, 10, "ssh-agent's socket")
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        yield sock
    finally:
        proc.terminate()
        proc.wait(10)


def user_config(home: Path, route: BehindBastion, bastion_key: Path, bastion_known_hosts: Path) -> None:
    """~/.ssh/config as a user keeps it: the target by alias behind the bastion's alias. The target's IdentityFile is an
    old key it no longer accepts; the key it accepts is in the agent (OpenSSH tries both)."""
    bastion = route.bastion.net.hosts[0].address
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    stale = home / ".ssh" / "id_old"
    if not stale.exists():
        keygen(stale)
    (home / ".ssh" / "config").write_text(
        f"""\
Host gpu-box
  HostName {route.inner.address}
  Port {route.target.port}
  User {route.target.user}
  IdentityFile ~/.ssh/id_old
  UserKnownHostsFile {route.target.known_hosts_path}
  ProxyJump jumpbox

Host jumpbox
  HostName {bastion}
  Port {route.bastion_server.port}
  User {route.bastion_server.user}
  IdentityFile {bastion_key}
  UserKnownHostsFile {bastion_known_hosts}
"""
    )


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: BehindBastion, agent: Path, prefect_harness: None) -> Iterator[Path]:
    """HOME with the config; the target's key in the agent; the bastion's key encrypted, its passphrase in the block
    `ssh-passphrase-jumpbox` and a wrong one in the shared variable (the per-host block must win)."""
    from prefect.blocks.system import Secret

    passphrase = f"jump-{uuid.uuid4().hex[:8]}"
    key = keygen(tmp_path / "jumpbox_key", passphrase=passphrase)
    route.bastion_server.authorize(key)
    subprocess.run(["ssh-add", "-q", str(route.target.key_path)], check=True, env={**os.environ, "SSH_AUTH_SOCK": str(agent)})
    Secret(value=passphrase).save(passphrase_block("jumpbox"), overwrite=True)
    monkeypatch.setenv(PASSPHRASE_ENV, "not-" + passphrase)
    folder = tmp_path / "home"
    user_config(folder, route, key, route.bastion_server.known_hosts_path)
    monkeypatch.setenv("HOME", str(folder))
    yield folder


ALIAS = Host(kind="ssh", hostname="gpu-box", ssh_config=True, connect_timeout_seconds=5.0, command_timeout_seconds=30.0)


def test_a_host_reached_by_its_alias_through_a_proxyjump_runs_commands_in_its_own_namespace(home: Path, route: BehindBastion) -> None:
    before = route.target.accepted_logins()
    transport = SSHTransport(ALIAS)
    try:
        addresses = transport.execute(Command(("ip", "-4", "-o", "addr", "show"))).stdout
    finally:
        transport.close()
    assert f"inet {route.inner.address}/24" in addresses, addresses
    assert transport.host.jump[0].hostname == route.bastion.net.hosts[0].address
    assert transport.host.key_path == str(home / ".ssh" / "id_old"), "the config's key was offered, the agent's let us in"
    assert route.target.accepted_logins() == before + 1


def test_the_doctor_passes_on_a_host_known_only_by_its_alias(home: Path, route: BehindBastion, tmp_path: Path) -> None:
    target = shell_target(tmp_path / "target", name="alias", host=ALIAS)
    checks = examine(target, None)
    assert passed(checks), "\n".join(c.line() for c in checks)
    assert [c.name for c in checks][:2] == ["hop 1", "host"]
    assert f"reached jump host {route.bastion_server.user}@{route.bastion.net.hosts[0].address}" in checks[0].detail


def test_an_unknown_bastion_key_stops_the_doctor_at_that_hop_naming_it(home: Path, route: BehindBastion, tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    user_config(home, route, Path(tmp_path / "jumpbox_key"), empty)
    checks = examine(shell_target(tmp_path / "target", name="alias", host=ALIAS), None)
    statuses = [(c.name, c.status) for c in checks]
    assert statuses[:2] == [("hop 1", Status.FAIL), ("host checks", Status.NOT_RUN)], statuses
    assert checks[0].detail.startswith(f"jump host {route.bastion_server.user}@{route.bastion.net.hosts[0].address}"), checks[0].detail
    assert "unknown host key" in checks[0].detail and "ssh-keyscan" in checks[0].advice
    assert "hop 1" in checks[1].detail and empty.read_text() == ""
