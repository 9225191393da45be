"""A private key held in a Prefect Secret block (`key_secret_block`), used in memory only, through real flow runs.

The key and its passphrase must never reach a log, an error, an artifact or an event: the test runs check-training
against a real sshd with the key from a block (and once with a wrong passphrase), then reads back from the session's
Prefect server every log line of those flow runs (relaunch's and paramiko's own loggers included, at DEBUG), every
artifact, every event since the test began and each run's state and parameters, and looks for each base64 line
of the key and for both passphrases.
"""

from __future__ import annotations

import logging
import re
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import pytest
import yaml

from relaunch.config import Host, load_target
from relaunch.errors import AuthenticationFailed, ConfigError
from relaunch.flows.check import check_training
from relaunch.tasks.launch import launch
from relaunch.testing.faults import wait_for
from relaunch.testing.sshd import SSHServer, keygen, sshd  # noqa: F401  (sshd is a fixture)
from relaunch.testing.targets import shell_target, stop_all
from relaunch.vocabulary import Verdict
from relaunch.wire.commands import Command
from relaunch.wire.ssh import PASSPHRASE_ENV, SSHTransport
from relaunch.wire.transport import close_all

T = TypeVar("T")
LOGGERS = ("relaunch", "paramiko", "tasks", "flows")  # besides Prefect's own run loggers, which always reach the API


@pytest.fixture(autouse=True)
def fresh_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)  # the block is the only source of the passphrase here
    close_all()
    yield
    close_all()


class BlockKey:
    """An encrypted user key authorised on the sshd, saved as Secret blocks, its file removed from this machine."""

    def __init__(self, server: SSHServer, folder: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.passphrase = f"pass-{tag}-b7e1"
        self.wrong_passphrase = f"wrong-{tag}-04c9"
        path = keygen(folder / "block_key", passphrase=self.passphrase)
        server.authorize(path)
        self.text = path.read_text()
        path.unlink()  # no key file on the worker: the block is the only copy
        self.body_lines = [line for line in self.text.splitlines() if line and not line.startswith("-----")]
        from prefect.blocks.system import Secret

        self.block, self.passphrase_block, self.wrong_block = f"key-{tag}", f"pass-{tag}", f"wrong-pass-{tag}"
        Secret(value=self.text).save(self.block)
        Secret(value=self.passphrase).save(self.passphrase_block)
        Secret(value=self.wrong_passphrase).save(self.wrong_block)

    @property
    def secrets(self) -> list[str]:
        return [*self.body_lines, self.passphrase, self.wrong_passphrase]

    def host(self, server: SSHServer, passphrase_block: str | None = None) -> Host:
        return server.ssh_host(
            key_path=None, key_secret_block=self.block, passphrase_secret_block=passphrase_block or self.passphrase_block
        )


@pytest.fixture
def block_key(sshd: SSHServer, tmp_path: Path, prefect_harness: None) -> BlockKey:
    return BlockKey(sshd, tmp_path)


def leaks(text: str, secrets: list[str]) -> list[str]:
    """Which secrets appear in the text (the first 12 characters of each, enough to tell them apart)."""
    return [s[:12] + "..." for s in secrets if s in text]


def api(call: Callable[..., T]) -> T:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return call(client)


def everything_the_server_holds(flow_run_ids: list[uuid.UUID], since: datetime) -> dict[str, str]:
    """The runs' logs, artifacts, states and parameters, and every event since `since`, as text per source."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId

    logs, offset = [], 0
    while page := api(lambda c: c.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=flow_run_ids)), limit=200, offset=offset)):
        logs += page
        offset += len(page)
    artifacts = api(lambda c: c.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=flow_run_ids))))
    runs = [api(lambda c: c.read_flow_run(i)) for i in flow_run_ids]
    return {
        "logs": "\n".join(f"{log.name} {log.message}" for log in logs),
        "artifacts": "\n".join(f"{a.key} {a.description} {a.data}" for a in artifacts),
        "events": events_since(since),
        "flow runs": "\n".join(f"{r.name} {r.state.message if r.state else ''} {r.parameters}" for r in runs),
    }


def events_since(since: datetime) -> str:
    """Every event the server stored since then, one JSON document a line."""
    from prefect.events.filters import EventFilter, EventOccurredFilter

    page = api(lambda c: c.read_events(filter=EventFilter(occurred=EventOccurredFilter(since=since)), limit=50))  # the server's page
    events = list(page.events)
    while page.next_page:
        page = api(lambda c: c.read_events_page(page.next_page))
        events += page.events
    return "\n".join(e.model_dump_json() for e in events)


@contextmanager
def every_log_to_the_api() -> Iterator[None]:
    """relaunch's and paramiko's loggers at DEBUG, into the flow run's logs on the server (as PREFECT_LOGGING_EXTRA_LOGGERS
    would), and Prefect's run loggers at DEBUG too: a leak at any level would be stored."""
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.logging.handlers import APILogHandler

    handler = APILogHandler(level=logging.DEBUG)
    # paramiko's transport threads carry no run context, so the API cannot file their lines (caplog still sees them).
    handler.addFilter(lambda record: FlowRunContext.get() is not None or TaskRunContext.get() is not None)
    names = (*LOGGERS, "prefect.flow_runs", "prefect.task_runs")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.DEBUG)
    for lg in loggers[: len(LOGGERS)]:
        lg.addHandler(handler)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        for lg in loggers[: len(LOGGERS)]:
            lg.removeHandler(handler)
        handler.flush()


def test_a_check_training_flow_run_uses_the_key_from_a_block_and_no_log_error_artifact_or_event_holds_the_key_or_passphrase(
    block_key: BlockKey, sshd: SSHServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    target = shell_target(tmp_path, name="block-key", host=block_key.host(sshd))
    wrong = target.model_copy(update={"host": block_key.host(sshd, passphrase_block=block_key.wrong_block)})
    since = datetime.now(UTC)
    logins = sshd.accepted_logins()
    try:
        launch.fn(target, 1)  # over SSH with the key from the block, outside any flow
        close_all()
        with every_log_to_the_api():
            good = check_training(target, return_state=True)
            close_all()
            bad = check_training(wrong, return_state=True)
        new_logins = sshd.accepted_logins() - logins
    finally:
        stop_all(target)
    report = good.result()
    assert good.is_completed() and report.verdict is Verdict.HEALTHY, f"{good.type}: {good.message}"
    assert new_logins == 2, "the launch and the check each logged in with the key from the block"

    error = bad.result(raise_on_failure=False)
    assert bad.is_failed() and isinstance(error, AuthenticationFailed), f"{bad.type}: {bad.message}"
    assert str(error) == (
        f"{target.host.label}: private key from Secret block {block_key.block!r}: cannot decrypt it with the passphrase from "
        f"Secret block {block_key.wrong_block!r} (wrong passphrase?)\n  what to do: put the key's passphrase in Secret block {block_key.wrong_block!r}"
    )

    runs = [good.state_details.flow_run_id, bad.state_details.flow_run_id]
    # The event persister writes in batches: wait for both runs' final state events before reading everything back.
    wait_for(lambda: all(f"prefect.flow-run.{i}" in events_since(since) for i in runs), 60, "the runs' events")
    held = everything_the_server_holds(runs, since)
    held["exception"] = "".join(traceback.format_exception(error))
    held["state messages"] = f"{good.message}\n{bad.message}"
    held["caplog"] = caplog.text
    assert "connected to " + target.host.route in held["logs"], "relaunch's own log lines reached the server"
    assert "paramiko.transport Trying SSH key " in held["logs"], "paramiko's debug lines reached the server (a fingerprint, never the key)"
    assert held["artifacts"] and held["events"], held
    assert len(leaks(block_key.text, block_key.secrets)) == len(block_key.body_lines) >= 3, "the search finds the key where it is"
    found = {source: leaks(text, block_key.secrets) for source, text in held.items()}
    assert not any(found.values()), f"secrets found: {found}"


def test_a_key_block_that_does_not_exist_fails_naming_the_block_and_what_to_do(sshd: SSHServer, prefect_harness: None) -> None:
    missing = f"no-such-key-{uuid.uuid4().hex[:8]}"
    transport = SSHTransport(sshd.ssh_host(key_path=None, key_secret_block=missing))
    with pytest.raises(AuthenticationFailed) as info:
        transport.execute(Command(("true",)))
    assert str(info.value) == (
        f"{sshd.user}@127.0.0.1:{sshd.port}: cannot load Secret block {missing!r}: ValueError\n"
        f"  what to do: create the Secret block {missing!r} on the Prefect server this worker uses (PREFECT_API_URL), or fix the name"
    )


def test_a_block_that_holds_no_private_key_fails_without_quoting_it(sshd: SSHServer, prefect_harness: None) -> None:
    from prefect.blocks.system import Secret

    name, text = f"not-a-key-{uuid.uuid4().hex[:8]}", f"hunter2-{uuid.uuid4().hex}"
    Secret(value=text).save(name)
    with pytest.raises(AuthenticationFailed) as info:
        SSHTransport(sshd.ssh_host(key_path=None, key_secret_block=name)).execute(Command(("true",)))
    assert f"private key from Secret block {name!r} is not a usable private key (ValueError)" in str(info.value), str(info.value)
    assert text not in "".join(traceback.format_exception(info.value))


@pytest.mark.parametrize(
    ("host", "field"),
    [
        ({"kind": "ssh", "hostname": "h", "key_path": "~/.ssh/id", "key_secret_block": "k"}, "host"),
        ({"kind": "ssh", "hostname": "h", "jump": [{"hostname": "b", "key_path": "~/.ssh/id", "key_secret_block": "k"}]}, "host.jump.0"),
        ({"kind": "ssh", "hostname": "h", "key_secret_block": "key\nname"}, "host.key_secret_block"),
    ],
)
def test_a_target_file_with_both_a_key_file_and_a_key_block_is_refused_naming_both(tmp_path: Path, host: dict, field: str) -> None:
    path = tmp_path / "target.yaml"
    fields = {"name": "t", "repo_dir": "/r", "venv_dir": "/v", "lock_file": "l", "launch_command": "x", "log_dir": "/l", "host": host}
    path.write_text(yaml.safe_dump(fields))
    with pytest.raises(ConfigError) as info:
        load_target(path)
    # The field, with the target file's line where it was read (`host (line 1): ...`).
    line = re.sub(r" \(line \d+\)", "", str(info.value).splitlines()[1])
    assert line.startswith(f"  {field}: "), str(info.value)
    if field != "host.key_secret_block":
        assert line == (
            f"  {field}: key_path and key_secret_block are both set: give one of them "
            "(a key file on this machine, or the Secret block holding the key)"
        )


def test_a_jump_host_can_take_its_key_from_a_block(block_key: BlockKey, sshd: SSHServer, tmp_path: Path) -> None:
    """The loopback sshd as its own jump host: the hop's key comes from the block, the last hop's from its file."""
    bastion = sshd.jump_host(key_path=None, key_secret_block=block_key.block, passphrase_secret_block=block_key.passphrase_block)
    transport = SSHTransport(sshd.ssh_host(jump=[bastion]))
    try:
        assert transport.execute(Command(("echo", "through"))).stdout == "through\n"
    finally:
        transport.close()
