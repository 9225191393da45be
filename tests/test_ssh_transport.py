"""SSHTransport against a real OpenSSH server on 127.0.0.1 (see relaunch/testing/sshd.py)."""

from __future__ import annotations

import logging
import socket
import statistics
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from relaunch.errors import AuthenticationFailed, CommandFailed, CommandTooLong, HostKeyError, Result, TransportError, is_transient
from relaunch.testing.faults import wait_for
from relaunch.testing.sshd import SSHServer, keygen, running_sshd, sshd  # noqa: F401  (sshd is a fixture)
from relaunch.wire.commands import Command, describe_container_failure, script
from relaunch.wire.ssh import PASSPHRASE_ENV, SSHTransport
from relaunch.wire.transport import run


@pytest.fixture
def transport(sshd: SSHServer):
    t = SSHTransport(sshd.ssh_host())
    yield t
    t.close()


def _sh(text: str, *args: str, **kw) -> Command:
    return script(text, *args, label=kw.pop("label", "test"), **kw)


def _full_text(exc: BaseException) -> str:
    """The exception, its causes and their tracebacks, as a log would show them."""
    return "".join(traceback.format_exception(exc))


def test_a_command_runs_and_returns_its_output_and_exit_code(transport: SSHTransport) -> None:
    result = transport.execute(_sh('echo "out:$1"; echo "err:$2" >&2', "a b", "c'd"))
    assert result == Result(0, "out:a b\n", "err:c'd\n", result.elapsed_seconds)
    assert result.elapsed_seconds > 0


def test_the_remote_command_is_the_shell_joined_host_argv(transport: SSHTransport, monkeypatch: pytest.MonkeyPatch) -> None:
    import shlex

    from fabric import Connection

    from relaunch.wire.commands import host_argv

    sent: list[str] = []
    original = Connection.run

    def spy(self, command, **kwargs):
        sent.append(command)
        return original(self, command, **kwargs)

    monkeypatch.setattr(Connection, "run", spy)
    command = Command(argv=("printf", "%s", "it's"), env=(("A", "$B"),), cwd="/tmp")
    assert transport.execute(command).stdout == "it's"
    # stdin from /dev/null on the host, never an EOF on the channel (OpenSSH drops the connection when one arrives
    # for a channel it already freed: "ieof packet referred to nonexistent channel", seen with 8 threads under load).
    assert sent == [shlex.join(host_argv(command, None, transport.host.command_timeout_seconds)) + " < /dev/null"]


def test_a_non_zero_exit_is_a_result_not_an_exception(transport: SSHTransport) -> None:
    result = transport.execute(_sh("echo partial; echo broken >&2; exit 7"))
    assert (result.exit_code, result.stdout, result.stderr) == (7, "partial\n", "broken\n")


def test_run_raises_command_failed_naming_host_command_exit_and_output_tail(transport: SSHTransport, sshd: SSHServer) -> None:
    with pytest.raises(CommandFailed) as info:
        run(transport, _sh("for i in 1 2 3; do echo line$i; done; echo boom >&2; exit 3", label="make-venv"), advice="fix it")
    exc = info.value
    assert (exc.host, exc.command, exc.exit_code) == (f"{sshd.user}@127.0.0.1:{sshd.port}", "make-venv", 3)
    text = str(exc)
    assert all(part in text for part in ("127.0.0.1", "`make-venv` exited 3", "line3", "boom", "what to do: fix it"))
    assert not is_transient(exc)


def test_one_connection_is_reused_by_every_call(sshd: SSHServer) -> None:
    transport = SSHTransport(sshd.ssh_host())
    logins = sshd.accepted_logins()
    start = time.perf_counter()
    transport.execute(Command(argv=("true",)))
    first = time.perf_counter() - start
    paramiko_transport = transport.connection.transport
    times = []
    for _ in range(50):
        start = time.perf_counter()
        assert transport.execute(Command(argv=("true",))).exit_code == 0
        times.append(time.perf_counter() - start)
        assert transport.connection.transport is paramiko_transport
    pct = SSHTransport(sshd.container_host("pct", "201"))
    pct_times = []
    for _ in range(20):
        start = time.perf_counter()
        pct.execute(Command(argv=("true",)))
        pct_times.append(time.perf_counter() - start)
    transport.close()
    pct.close()
    assert sshd.accepted_logins() - logins == 2  # one per transport, however many commands
    times.sort()
    print(
        f"\nSSH round trip over one reused connection, `true` x{len(times)}: median {statistics.median(times) * 1000:.1f} ms, "
        f"p95 {times[int(len(times) * 0.95)] * 1000:.1f} ms, min {times[0] * 1000:.1f} ms; first call with connect "
        f"{first * 1000:.1f} ms; through the pct stand-in: median {statistics.median(pct_times) * 1000:.1f} ms"
    )


def test_calls_from_many_threads_share_one_connection(sshd: SSHServer) -> None:
    transport = SSHTransport(sshd.ssh_host())
    logins = sshd.accepted_logins()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: transport.execute(_sh('printf %s "$1"', str(i))), range(40)))
    transport.close()
    assert [r.stdout for r in results] == [str(i) for i in range(40)]
    assert sshd.accepted_logins() - logins == 1


def test_unknown_host_key_is_refused_by_default(sshd: SSHServer, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("# operator's file\n")
    transport = SSHTransport(sshd.ssh_host(known_hosts_path=str(known_hosts)))
    with pytest.raises(HostKeyError) as info:
        transport.execute(Command(argv=("true",)))
    text = str(info.value)
    fingerprint = SSHTransport(sshd.ssh_host()).execute(Command(argv=("ssh-keygen", "-lf", f"{sshd.host_key}.pub"))).stdout.split()[1]
    assert "unknown host key" in text and fingerprint in text and f"127.0.0.1:{sshd.port}" in text
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {known_hosts}" in text and "trust_on_first_use" in text
    assert known_hosts.read_text() == "# operator's file\n"
    assert not is_transient(info.value)


def test_a_missing_known_hosts_file_refuses_and_is_not_created(sshd: SSHServer, tmp_path: Path) -> None:
    known_hosts = tmp_path / "absent" / "known_hosts"
    with pytest.raises(HostKeyError, match="unknown host key"):
        SSHTransport(sshd.ssh_host(known_hosts_path=str(known_hosts))).execute(Command(argv=("true",)))
    assert not known_hosts.exists()


def test_a_malformed_known_hosts_line_is_named_in_a_host_key_error(sshd: SSHServer, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(sshd.known_hosts_line() + "[h]:1 ssh-ed25519 !!notbase64\n")
    with pytest.raises(HostKeyError, match="malformed line.*notbase64"):
        SSHTransport(sshd.ssh_host(known_hosts_path=str(known_hosts))).execute(Command(argv=("true",)))


@pytest.mark.parametrize("trust_on_first_use", [False, True])
def test_a_changed_host_key_is_refused_even_with_trust_on_first_use(sshd: SSHServer, tmp_path: Path, trust_on_first_use: bool) -> None:
    other = keygen(tmp_path / "other_host_key")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(sshd.known_hosts_line(other.with_suffix(".pub")))
    before = known_hosts.read_text()
    transport = SSHTransport(sshd.ssh_host(known_hosts_path=str(known_hosts), trust_on_first_use=trust_on_first_use))
    with pytest.raises(HostKeyError) as info:
        transport.execute(Command(argv=("true",)))
    text = str(info.value)
    assert "CHANGED" in text and "man-in-the-middle" in text and "ssh-keygen -R" in text
    assert known_hosts.read_text() == before


def test_a_host_known_only_under_another_key_type_is_refused_with_trust_on_first_use(sshd: SSHServer, tmp_path: Path) -> None:
    rsa = tmp_path / "rsa_host_key"
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(rsa)], check=True)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(sshd.known_hosts_line(rsa.with_suffix(".pub")))
    transport = SSHTransport(sshd.ssh_host(known_hosts_path=str(known_hosts), trust_on_first_use=True))
    with pytest.raises(HostKeyError, match="CHANGED"):
        transport.execute(Command(argv=("true",)))
    assert known_hosts.read_text() == sshd.known_hosts_line(rsa.with_suffix(".pub"))


def test_trust_on_first_use_accepts_and_records_an_unknown_key(sshd: SSHServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    known_hosts = tmp_path / "ssh" / "known_hosts"
    known_hosts.parent.mkdir()
    known_hosts.write_text("# kept\nother.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl")
    with caplog.at_level(logging.WARNING, logger="relaunch.wire.ssh"):
        assert (
            SSHTransport(sshd.ssh_host(known_hosts_path=str(known_hosts), trust_on_first_use=True))
            .execute(Command(argv=("true",)))
            .exit_code
            == 0
        )
    lines = known_hosts.read_text().splitlines()
    assert lines[:2] == ["# kept", "other.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"]
    assert lines[2:] == [sshd.known_hosts_line().strip()]
    assert "recorded new host key" in caplog.text
    # Recorded: a strict transport now trusts it.
    assert SSHTransport(sshd.ssh_host(known_hosts_path=str(known_hosts))).execute(Command(argv=("true",))).exit_code == 0


def test_a_wrong_user_key_fails_authentication(sshd: SSHServer, tmp_path: Path) -> None:
    stranger = keygen(tmp_path / "stranger")
    transport = SSHTransport(sshd.ssh_host(key_path=str(stranger)))
    with pytest.raises(AuthenticationFailed) as info:
        transport.execute(Command(argv=("true",)))
    text = str(info.value)
    assert f"{sshd.user}@127.0.0.1:{sshd.port}" in text and str(stranger) in text
    assert not is_transient(info.value)


def test_a_missing_key_file_fails_authentication_naming_it(sshd: SSHServer, tmp_path: Path) -> None:
    with pytest.raises(AuthenticationFailed, match="cannot read it"):
        SSHTransport(sshd.ssh_host(key_path=str(tmp_path / "nope"))).execute(Command(argv=("true",)))


def test_nothing_listening_raises_transport_error_quickly(sshd: SSHServer) -> None:
    port = _closed_port()
    start = time.monotonic()
    with pytest.raises(TransportError) as info:
        SSHTransport(sshd.ssh_host(port=port)).execute(Command(argv=("true",), label="probe"))
    assert time.monotonic() - start < 2
    text = str(info.value)
    assert (
        "cannot connect" in text
        and f"127.0.0.1:{port}" in text
        and "Connection refused" in text
        and "sshd listens on port" in text
        and "probe" in text
    )
    # Never reached in this process: an answer (a wrong port, a host that is down), not retried; tests/test_cli_outcomes.py
    # shows that a host reached before and then refusing (sshd restarting) is.
    assert not is_transient(info.value)


def test_a_server_that_never_answers_times_out_after_connect_timeout(sshd: SSHServer) -> None:
    with socket.socket() as silent:  # accepts TCP (backlog) but never sends an SSH banner
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(TransportError) as info:
            SSHTransport(sshd.ssh_host(port=port, connect_timeout_seconds=0.5)).execute(Command(argv=("true",)))
        assert 0.4 < time.monotonic() - start < 3
    assert f"127.0.0.1:{port}" in str(info.value)


def test_a_restarted_server_is_reconnected() -> None:
    with running_sshd() as server:  # its own server: restarting the shared one would disturb other tests
        transport = SSHTransport(server.ssh_host())
        assert transport.execute(Command(argv=("echo", "before"))).stdout == "before\n"
        old = transport.connection.transport
        server.restart()
        try:
            first = transport.execute(Command(argv=("echo", "after")))
            print("\nafter the restart the first call reconnected transparently")
        except TransportError as exc:
            print(f"\nafter the restart the first call raised TransportError ({exc.reason}); the next one reconnects")
            first = transport.execute(Command(argv=("echo", "after")))
        assert first.stdout == "after\n"
        assert transport.connection.transport is not old
        assert transport.execute(Command(argv=("true",))).exit_code == 0
        transport.close()


def test_a_connection_lost_mid_command_raises_transport_error_and_the_next_call_reconnects(tmp_path: Path) -> None:
    started = tmp_path / "started"
    with running_sshd() as server:
        transport = SSHTransport(server.ssh_host())
        transport.execute(Command(argv=("true",)))
        problems: list[BaseException] = []

        def restart_once_the_command_runs() -> None:
            try:
                wait_for(started.exists, 20, "the remote sleep to start")
                server.restart()
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                problems.append(exc)

        restarter = threading.Thread(target=restart_once_the_command_runs, daemon=True)
        restarter.start()
        try:
            with pytest.raises(TransportError) as info:
                transport.execute(Command(argv=("bash", "-c", 'touch "$1"; exec sleep 20', "-", str(started)), label="long step"))
        finally:
            restarter.join(30)
        assert not problems and not restarter.is_alive(), problems
        assert "long step" in str(info.value) and is_transient(info.value), (
            "a dropped connection is a fault of the wire: the task retries it"
        )
        assert transport.execute(Command(argv=("echo", "ok"))).stdout == "ok\n"
        # A command that failed on the host is an answer, not a fault of the wire: never retried.
        # (tests/test_remote_flow.py::test_a_dropped_connection_is_retried_by_prefect_and_a_failed_command_is_not
        # shows both through a real task with retries; it is this row's second proof in the fault matrix.)
        with pytest.raises(CommandFailed) as failed:
            run(transport, Command(argv=("bash", "-c", "echo half done; exit 4"), label="failing step"))
        assert failed.value.exit_code == 4 and "half done" in str(failed.value) and not is_transient(failed.value)
        transport.close()


@pytest.mark.parametrize(("kind", "cid"), [("pct", "201"), ("docker", "trainer")])
def test_commands_run_through_the_container_stand_ins(sshd: SSHServer, kind: str, cid: str) -> None:
    transport = SSHTransport(sshd.container_host(kind, cid))
    result = transport.execute(_sh('printf "%s|" "$@"; printf "%s" "$PWD"', "a b", "$HOME", "'", cwd="/tmp", env={"X": "y z"}))
    assert result.stdout == "a b|$HOME|'|/tmp"
    assert transport.execute(Command(argv=("printenv", "X"), env=(("X", "y z"),))).stdout == "y z\n"
    transport.close()


@pytest.mark.parametrize(
    ("kind", "cid", "exit_code", "message", "described"),
    [
        ("pct", "203", 255, "Configuration file 'nodes/", "LXC container 203 does not exist"),
        (
            "pct",
            "202",
            1,
            "lxc-attach: 202: ../src/lxc/attach.c: lxc_attach: 1136 Failed to get init pid",
            "LXC container 202 is not running",
        ),
        ("docker", "gone", 1, "Error response from daemon: No such container: gone", "docker container gone does not exist"),
        ("docker", "stopped-trainer", 1, "Error response from daemon: container ", "is not running"),
    ],
)
def test_a_missing_or_stopped_container_gives_the_real_error_in_command_failed(
    sshd: SSHServer, kind: str, cid: str, exit_code: int, message: str, described: str
) -> None:
    transport = SSHTransport(sshd.container_host(kind, cid))
    with pytest.raises(CommandFailed) as info:
        run(transport, Command(argv=("true",), label="check"))
    assert info.value.exit_code == exit_code and message in str(info.value) and f"({kind} {cid})" in info.value.host
    result = transport.execute(Command(argv=("true",)))
    assert described in (describe_container_failure(result) or "")
    transport.close()


def test_describe_container_failure_ignores_ordinary_failures() -> None:
    assert describe_container_failure(Result(0, "", "Error response from daemon: No such container: x")) is None
    assert describe_container_failure(Result(2, "", "grep: missing file")) is None


def test_a_command_over_its_timeout_is_stopped_on_the_host_and_the_connection_survives(transport: SSHTransport) -> None:
    transport.execute(Command(argv=("true",)))
    connection = transport.connection.transport
    start = time.monotonic()
    with pytest.raises(TransportError) as info:
        transport.execute(Command(argv=("sleep", "37.5"), timeout_seconds=0.5, label="slow"))
    assert time.monotonic() - start < 5
    assert "timed out after 0.5 s (stopped on the host)" in str(info.value) and "slow" in str(info.value)
    assert is_transient(info.value)
    assert transport.execute(Command(argv=("true",))).exit_code == 0
    assert transport.connection.transport is connection
    # Looked up only to check it is gone: the host's `timeout` ended it.
    assert transport.execute(_sh("pgrep -f 'sleep 3[7].5' || true")).stdout.split() == []


def test_a_command_reading_stdin_sees_end_of_file(transport: SSHTransport) -> None:
    result = transport.execute(Command(argv=("cat",), timeout_seconds=5))
    assert (result.exit_code, result.stdout) == (0, "")


def test_long_non_ascii_output_survives_read_boundaries(transport: SSHTransport) -> None:
    result = transport.execute(_sh("yes 'é日🙂' | head -n 40000"))  # 400 kB: many reads, characters split between them
    assert result.stdout == "é日🙂\n" * 40000


def test_a_command_too_long_for_the_host_is_refused_before_it_can_drop_the_connection(transport: SSHTransport, sshd: SSHServer) -> None:
    logins = sshd.accepted_logins()
    transport.execute(Command(argv=("true",)))
    with pytest.raises(CommandTooLong, match="limit is 131071"):
        transport.execute(Command(argv=("printf", "%s", "x" * 300_000), label="huge"))
    near = "é" * 60_000  # 120 kB quoted: still fits in one argv string
    assert transport.execute(_sh('printf %s "$1"', near)).stdout == near
    assert sshd.accepted_logins() - logins == 1


def test_the_passphrase_comes_from_the_environment_and_never_appears_in_errors(
    sshd: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    passphrase = "correct-horse-7f3a9"
    key = keygen(tmp_path / "encrypted", passphrase=passphrase)
    sshd.authorize(key)
    host = sshd.ssh_host(key_path=str(key))
    caplog.set_level(logging.DEBUG)

    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    with pytest.raises(AuthenticationFailed, match=PASSPHRASE_ENV) as missing:
        SSHTransport(host).execute(Command(argv=("true",)))

    monkeypatch.setenv(PASSPHRASE_ENV, "not-" + passphrase)
    with pytest.raises(AuthenticationFailed, match="wrong passphrase") as wrong:
        SSHTransport(host).execute(Command(argv=("true",)))

    monkeypatch.setenv(PASSPHRASE_ENV, passphrase)
    assert SSHTransport(host).execute(Command(argv=("echo", "in"))).stdout == "in\n"

    for exc in (missing.value, wrong.value):
        assert passphrase not in _full_text(exc) and str(key) in str(exc)
    assert passphrase not in caplog.text


def test_the_passphrase_can_come_from_a_prefect_secret_block_loaded_only_when_needed(
    sshd: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_harness: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A real Secret block saved to the session's Prefect test server; a block that does not exist fails clearly."""
    from prefect.blocks.system import Secret

    # What every task (relaunch.tasks.common) and the CLI's start-up do: the core's SSH asks Prefect for the block
    # through this loader. Done here too, so the test does not pass only after another test module imported a task.
    from relaunch.tasks.secrets import install

    install()

    passphrase = "block-held-5c1e"
    key = keygen(tmp_path / "encrypted", passphrase=passphrase)
    sshd.authorize(key)
    tag = uuid.uuid4().hex[:8]
    good, wrong, missing = f"ssh-pass-{tag}", f"ssh-pass-wrong-{tag}", f"ssh-pass-missing-{tag}"
    Secret(value=passphrase).save(good)
    Secret(value="not-" + passphrase).save(wrong)
    assert Secret.load(good).get() == passphrase, "the block is on the server"
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    caplog.set_level(logging.DEBUG)

    # An unencrypted key needs no passphrase: the block is never loaded, so even a missing one does no harm.
    plain = SSHTransport(sshd.ssh_host(passphrase_secret_block=missing))
    assert plain.execute(Command(argv=("echo", "plain"))).stdout == "plain\n"
    plain.close()

    encrypted = SSHTransport(sshd.ssh_host(key_path=str(key), passphrase_secret_block=good))
    assert encrypted.execute(Command(argv=("echo", "ok"))).stdout == "ok\n"
    encrypted.close()

    with pytest.raises(AuthenticationFailed) as not_there:
        SSHTransport(sshd.ssh_host(key_path=str(key), passphrase_secret_block=missing)).execute(Command(argv=("true",)))
    assert f"cannot load Secret block {missing!r}" in str(not_there.value) and "127.0.0.1" in str(not_there.value), str(not_there.value)

    with pytest.raises(AuthenticationFailed) as bad:
        SSHTransport(sshd.ssh_host(key_path=str(key), passphrase_secret_block=wrong)).execute(Command(argv=("true",)))
    assert f"cannot decrypt it with the passphrase from Secret block {wrong!r} (wrong passphrase?)" in str(bad.value) and str(key) in str(
        bad.value
    )

    for exc in (not_there.value, bad.value):
        assert passphrase not in _full_text(exc)
    assert passphrase not in caplog.text


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
