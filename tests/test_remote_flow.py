"""The recovery over SSH, through a container stand-in, exactly as locally; one connection per flow run."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest
from prefect import flow

from relaunch.config import Target
from relaunch.errors import CommandFailed
from relaunch.flows.check import check_training
from relaunch.flows.recover import recover_training
from relaunch.tasks.common import step_task
from relaunch.tasks.stop import stop
from relaunch.testing.faults import wait_for
from relaunch.testing.sshd import SSHServer, sshd  # noqa: F401  (sshd is a fixture)
from relaunch.testing.targets import finished, shell_target
from relaunch.vocabulary import Cause, Verdict
from relaunch.wire.commands import Command
from relaunch.wire.transport import close_all, run, transport_for

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(autouse=True)
def fresh_connections():
    close_all()
    yield
    close_all()


def test_the_whole_recovery_runs_over_ssh_through_a_container_on_one_connection(tmp_path, sshd: SSHServer):
    sshd.set_containers(running=["200"])
    target = shell_target(tmp_path, host=sshd.container_host("pct", "200"), env={"EXIT_AT": "2", "EXIT_CODE": "3"})
    healthy = target.model_copy(update={"env": {}})
    logins = sshd.accepted_logins()
    try:
        first = finished(recover_training, target=target)  # launches, sees it die with exit 3, escalates after the same failure twice
        second = recover_training(healthy)
    finally:
        stop.fn(healthy)
    assert [a.verdict for a in first.attempts][:2] == [Verdict.UNKNOWN, Verdict.CRASHED]
    assert first.attempts[1].cause is Cause.ERROR and "exit code 3" in first.attempts[1].evidence
    assert second.ok and second.attempts[-1].verdict is Verdict.HEALTHY
    assert sshd.accepted_logins() - logins == 1, "every step and poll of both flows shared one SSH connection"


def test_a_check_through_a_stopped_container_names_host_container_and_command(tmp_path, sshd: SSHServer):
    sshd.set_containers(stopped=["201"])
    target = shell_target(tmp_path, host=sshd.container_host("pct", "201"))
    with pytest.raises(CommandFailed) as err:
        check_training(target)
    text = str(err.value)
    assert "pct 201" in text and "health poll" in text and "exited" in text
    assert "LXC container 201 is not running (start it with `pct start 201`)" in text, "what to do, in words"
    assert "lxc-attach" in err.value.result.stderr and err.value.exit_code == err.value.result.exit_code != 0, (
        "the error carries the result"
    )


def test_a_dropped_connection_is_retried_by_prefect_and_a_failed_command_is_not(tmp_path, sshd: SSHServer):
    target = shell_target(tmp_path, host=sshd.ssh_host())
    started = tmp_path / "started"
    calls: list[str] = []
    cutters: list[threading.Thread] = []
    problems: list[BaseException] = []

    def cut_once_started(session: int) -> None:
        try:
            wait_for(started.exists, 20, "the remote sleep to start")
            os.kill(session, signal.SIGKILL)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            problems.append(exc)

    @step_task("probe", retries=2)
    def probe(target: Target, command: str) -> str:
        calls.append(command)
        transport = transport_for(target.host)
        transport.execute(Command(("true",)))  # the connection is up, so sshd has a session process
        if command == "drop" and len(calls) == 1:
            # Cut the connection under a running command, once it runs on the host: the wire fails, not the host.
            cutters.append(threading.Thread(target=cut_once_started, args=(sshd_child(sshd),), daemon=True))
            cutters[-1].start()
            command = f'touch "{started}"; exec sleep 30'
        elif command == "drop":
            command = "true"
        return run(transport, Command(("bash", "-c", command), label=command)).stdout

    @flow
    def probe_flow(command: str) -> str:
        return probe(target, command)

    assert probe_flow("drop") == ""
    for cutter in cutters:
        cutter.join(30)
    assert not problems and len(cutters) == 1 and not cutters[0].is_alive(), problems
    assert calls == ["drop", "drop"], "the dropped connection was retried once"
    calls.clear()
    with pytest.raises(CommandFailed, match="exited 4"):
        probe_flow("exit 4")
    assert calls == ["exit 4"], "a command that failed on the host is not retried"


def sshd_child(server: SSHServer) -> int:
    """The sshd process serving our connection: the master's child, found by its recorded PID."""
    master = int((server.workdir / "sshd.pid").read_text())
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    assert children, "no sshd session process"
    return int(children[-1])


@pytest.mark.long
def test_the_demo_target_recovers_over_ssh_through_a_container(tmp_path, sshd: SSHServer):
    from relaunch.demo.scenarios import prepare

    sshd.set_containers(running=["200"])
    # Broken and crashed, as the demo does it; its own name, so the demo scenario tests may run beside it.
    local = prepare("missing-dependency", tmp_path / "demo", name="relaunch-remote-missing-dependency")
    target = local.model_copy(update={"host": sshd.container_host("pct", "200")})
    try:
        report = recover_training(target)
    finally:
        stop.fn(target)
    assert (report.attempts[0].cause, report.attempts[0].package) == (Cause.MISSING_DEPENDENCY, "tinyaccel")
    assert report.ok, report.timeline()


def test_relaunch_check_reads_an_ssh_target_file_and_reports_json(tmp_path, sshd: SSHServer):
    import json
    import subprocess

    import yaml

    target = shell_target(tmp_path, host=sshd.container_host("docker", "trainer"))
    sshd.set_containers(running=["trainer"])
    from relaunch.tasks.launch import launch

    launch.fn(target, 1)
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(target.model_dump(mode="json")))
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    env.pop("PREFECT_API_URL", None)
    try:
        # A bound on a hang: with no API the command boots its own temporary server, over 120 s on 2 loaded cores.
        out = subprocess.run(
            [sys.executable, "-m", "relaunch.cli", "check", str(path), "--json"], capture_output=True, text=True, env=env, timeout=600
        )
    finally:
        stop.fn(target)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["verdict"] == "healthy" and report["host"].endswith("(docker trainer)")


def test_the_incidents_run_started_by_hand_is_adopted_and_left_running_by_the_nightly_check_over_ssh_through_a_container(
    tmp_path, sshd: SSHServer
):
    """`tmux new-session -d -s dflash "bash start_training.sh 2>&1 | tee /workspace/train_stdout_clean.log"`, as in
    the incident, reached as `ssh root@HOST 'pct exec 200 -- bash -c ...'`: adopted, healthy, not one process touched."""
    from relaunch import runlayout
    from tests.handmade import last_step, reap, start_by_hand, tree

    sshd.set_containers(running=["200"])
    target = shell_target(tmp_path, host=sshd.container_host("pct", "200"))
    log = tmp_path / "workspace" / "train_stdout_clean.log"
    log.parent.mkdir()
    pane = start_by_hand(target.tmux_session, f"bash stepper.sh 2>&1 | tee {log}", target.repo_dir)
    try:
        wait_for(lambda: (last_step(log) or 0) >= 3, 20, "the run started by hand to step")
        before = [p for p in tree(pane) if p.argv[:1] != ("sleep",)]
        report = finished(check_training, target=target, recover=True)
        assert report.verdict is Verdict.HEALTHY and [a.action.value for a in report.attempts] == ["none"], report.timeline()
        state = Path(target.state_path)
        run_id = (state / runlayout.CURRENT).read_text().strip()
        assert run_id.endswith("-adopted") and (state / "runs" / run_id / "adopted").read_text().strip() == "tee"
        assert Path(runlayout.record(target.state_path, run_id, runlayout.LOG_PATH)).read_text().strip() == str(log)
        assert all(p.alive() for p in before), "the nightly check touched the hand-started run"
        seen = last_step(log) or 0
        wait_for(lambda: (last_step(log) or 0) > seen, 20, "the run to go on stepping")
    finally:
        reap([target.tmux_session], [tmp_path])
