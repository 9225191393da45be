"""`relaunch deploy` as a new user meets it: relaunch installed from its wheel in a clean venv (no checkout on PATH or
under the worker), a real Prefect server and a real process worker from that venv, a real local target found by its
name in ~/.config/relaunch/targets. Plus the pure parts of `relaunch status`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from relaunch.cli.status import parse_report, render, row
from relaunch.config import Target
from relaunch.records.deadman import deadman_name
from relaunch.testing.faults import wait_for
from relaunch.testing.targets import shell_target, stop_all, tmux_alive
from relaunch.vocabulary import Verdict
from tests.installed import clean_env, installed_venv


def test_a_deployed_target_is_recovered_by_its_deployment_on_a_worker_with_only_the_wheel(prefect_harness, tmp_path, tmp_path_factory):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    venv = installed_venv(tmp_path_factory.getbasetemp().parent)
    name = f"wheel-{uuid.uuid4().hex[:6]}"
    target = shell_target(tmp_path / "t", name=name)  # never launched: the nightly check recovers it
    folder = tmp_path / "config" / "relaunch" / "targets"
    folder.mkdir(parents=True)
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(target.model_dump(mode="json")))
    pool = f"relaunch-{name}"  # its own pool: no other test's worker takes these runs
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(
        home, PREFECT_API_URL=PREFECT_API_URL.value(), XDG_CONFIG_HOME=str(tmp_path / "config"), PREFECT_WORKER_QUERY_SECONDS="1"
    )
    bin_ = venv / "bin"

    def cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(bin_ / argv[0]), *argv[1:]], env=env, cwd=home, capture_output=True, text=True, timeout=timeout)

    deployed = cli("relaunch", "deploy", name, "--pool", pool, "--json")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr[-3000:]
    again = cli("relaunch", "deploy", name, "--pool", pool, "--json")
    first, second = json.loads(deployed.stdout), json.loads(again.stdout)
    assert (first["check_deployment_id"], first["recover_deployment_id"]) == (
        second["check_deployment_id"],
        second["recover_deployment_id"],
    )

    client = get_client(sync_client=True)
    with client:
        nightly = client.read_deployment_by_name(f"check-training/nightly-{name}")
        recover = client.read_deployment_by_name(f"recover-training/{name}")
        limit = client.read_global_concurrency_limit_by_name("relaunch-host-localhost")
    (schedule,) = nightly.schedules
    assert (schedule.schedule.cron, schedule.schedule.timezone, schedule.active, schedule.slug) == ("0 3 * * *", "UTC", True, "nightly")
    assert (nightly.entrypoint, recover.entrypoint) == ("relaunch.flows.check.check_training", "relaunch.flows.recover.recover_training")
    assert not nightly.pull_steps and nightly.parameters["recover"] is True and limit.limit == 1
    assert nightly.parameters["target"] == target.model_dump(mode="json")

    worker = subprocess.Popen(
        [str(bin_ / "prefect"), "worker", "start", "--pool", pool, "--type", "process"],
        env=env,
        cwd=home,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "worker.log", "w"),
        start_new_session=True,
    )
    try:
        out = cli("prefect", "deployment", "run", f"check-training/nightly-{name}", "--watch", "--watch-timeout", "150", timeout=180)
        assert out.returncode == 0 and "Flow run finished successfully in 'Recovered'" in out.stdout, (
            out.stdout[-3000:] + (tmp_path / "worker.log").read_text()[-3000:]
        )
        assert tmux_alive(target.tmux_session), "the deployment's run launched the trainer"
        status = cli("relaunch", "status", "--json")
        assert status.returncode == 0, status.stderr[-2000:]
        (line,) = json.loads(status.stdout)
        assert (line["target"], line["verdict"], line["last_recovery_state"], line["nightly"]) == (
            name,
            "healthy",
            "Recovered",
            "0 3 * * * UTC",
        )
        alarm = deadman_name(f"check-training/nightly-{name}", name)
        with get_client(sync_client=True) as c:
            assert [a.name for a in c.read_automations_by_name(alarm)] == [alarm], "deploy made the nightly check's dead-man alarm"
        undeployed = cli("relaunch", "undeploy", name)
        assert undeployed.returncode == 0 and "deleted" in undeployed.stdout, undeployed.stdout + undeployed.stderr
        assert f"automation {alarm} deleted" in undeployed.stdout, undeployed.stdout
        with get_client(sync_client=True) as c:
            assert not [a for a in c.read_automations_by_name(alarm) if a.name == alarm], "no alarm left for a check that is gone"
    finally:
        os.killpg(worker.pid, signal.SIGINT)  # the session this test started for the worker
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        stop_all(target)
    assert len(list((Path(target.state_path) / "runs").iterdir())) == 1, "launched once"
    wait_for(lambda: not _exists(f"check-training/nightly-{name}"), 10, "the nightly deployment to be gone")


def _exists(name: str) -> bool:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
        except ObjectNotFound:
            return False
    return True


def test_status_gives_the_verdict_since_its_first_report_in_an_unbroken_run_and_the_last_recovery():
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    t = Target.model_validate(
        {
            "name": "dflash",
            "repo_dir": "/r",
            "venv_dir": "/r/.venv",
            "launch_command": "x",
            "tmux_session": "s",
            "log_dir": "/l",
            "lock_file": "r.lock",
        }
    )
    reports = [
        parse_report(now - timedelta(hours=30), "crashed: gpu fault"),
        parse_report(now - timedelta(hours=29), "healthy: recovered"),
        parse_report(now - timedelta(hours=5), "healthy: fine"),
        parse_report(now - timedelta(hours=1), "healthy: still fine"),
    ]
    r = row(
        t, reports, [(now - timedelta(hours=29), "Completed"), (now - timedelta(hours=30), "Failed")], "93.1% productive", "0 3 * * * UTC"
    )
    assert (r.verdict, r.since, r.message, r.last_recovery_state, r.goodput) == (
        Verdict.HEALTHY,
        now - timedelta(hours=29),
        "still fine",
        "Completed",
        "93.1%",
    )
    table = render([r], now).splitlines()
    assert (
        table[0].split()[:5] == ["TARGET", "HOST", "NOW", "SINCE", "LAST"] and "healthy since 29h ago" in table[1] and "93.1%" in table[1]
    )
    assert row(t, [], [], None, None).verdict is None and parse_report(now, "not a verdict: x").verdict is None
