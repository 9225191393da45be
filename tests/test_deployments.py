"""relaunch operated through Prefect: scripts/serve.sh (as `make serve-demo`) brings up a real server (its own PREFECT_HOME, a free
port), the `relaunch` process pool, the per-host concurrency limit, `prefect deploy --all` from prefect.yaml
and a real process worker; the tests drive it with the `prefect` CLI and the API, as a person would.
The real demo target is prepared by serve.sh and recovered through the deployment as deployed (~90 s here).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from relaunch.config import Host, Target
from relaunch.demo.target import make_target
from relaunch.tasks.health import collect_snapshot
from relaunch.tasks.launch import launch
from relaunch.testing.faults import wait_for
from relaunch.testing.targets import shell_target, stop_all, tmux_alive, wait_for_exit
from relaunch.vocabulary import Action

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@dataclass
class ControlPlane:
    process: subprocess.Popen
    api_url: str
    home: Path
    demo_dir: Path
    output: list[str] = field(default_factory=list)
    server_pid: int = 0
    worker_pid: int = 0

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "PREFECT_API_URL": self.api_url, "PREFECT_HOME": str(self.home), "COLUMNS": "400", **extra}

    def prefect(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "prefect"), *args], cwd=ROOT, env=self.env(), capture_output=True, text=True, timeout=timeout)

    def api(self, call):
        """Run `await call(client)` against this server, from this process."""
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        async def go():
            async with get_client() as client:
                return await call(client)

        with temporary_settings({PREFECT_API_URL: self.api_url}):
            return asyncio.run(go())

    def stop(self) -> int | None:
        """SIGTERM to serve.sh, which stops worker, demo trainer and server; anything left is killed by its PID."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)  # the session this test started for serve.sh
                self.process.wait()
        for pid in (self.worker_pid, self.server_pid):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
        return self.process.returncode


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of an exited serve.sh is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def squash(text: str) -> str:
    """CLI output without rich's line wrapping."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    base = tmp_path_factory.mktemp("serve")
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(base / "home"),
        "RELAUNCH_SERVE_PORT": str(port),
        "RELAUNCH_DEMO_DIR": str(base / "demo"),
        "PREFECT_SERVER_UI_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "SERVE_DEMO": "1",  # `make serve-demo`: these tests drive prefect.yaml's demo deployments
    }
    env.pop("PREFECT_API_URL", None)
    process = subprocess.Popen(
        [str(ROOT / "scripts" / "serve.sh")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    cp = ControlPlane(process=process, api_url=f"http://127.0.0.1:{port}/api", home=base / "home", demo_dir=base / "demo")
    ready = threading.Event()

    def pump() -> None:
        for line in process.stdout:
            cp.output.append(line.rstrip())
            if m := re.search(r"\] (server|worker) pid (\d+)", line):
                setattr(cp, f"{m[1]}_pid", int(m[2]))
            if "] ready:" in line:
                ready.set()
        ready.set()  # serve.sh ended

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert ready.wait(300) and process.poll() is None, "serve.sh did not get ready:\n" + "\n".join(cp.output)
        yield cp
    finally:
        cp.stop()


def read_deployment(plane: ControlPlane, name: str):
    return plane.api(lambda c: c.read_deployment_by_name(name))


def demo_target_as_built(demo_dir: Path) -> Target:
    wheelhouse = Path(os.environ.get("RELAUNCH_WHEELHOUSE", ROOT / ".cache" / "wheelhouse"))
    built = make_target(demo_dir, "relaunch-demo", demo_dir / "wheels", wheelhouse)
    return built.model_copy(update={"tmux_session": "relaunch-demo"})


def test_deploy_puts_both_demo_deployments_on_the_relaunch_process_pool(plane):
    pool = plane.api(lambda c: c.read_work_pool("relaunch"))
    assert pool.type == "process"
    for name, entrypoint in [
        ("recover-training/demo", "flows/recover.py:recover_training"),
        ("check-training/nightly-demo", "flows/check.py:check_training"),
    ]:
        d = read_deployment(plane, name)
        assert (d.work_pool_name, d.entrypoint, d.enforce_parameter_schema) == ("relaunch", entrypoint, True)
        assert d.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]


def test_the_deployed_target_is_the_demo_target_that_demo_target_py_builds(plane):
    expected = demo_target_as_built(plane.demo_dir)
    for name in ("recover-training/demo", "check-training/nightly-demo"):
        assert Target.model_validate(read_deployment(plane, name).parameters["target"]) == expected


def test_the_nightly_check_runs_at_three_utc_and_recovers_what_it_finds_sick(plane):
    d = read_deployment(plane, "check-training/nightly-demo")
    (schedule,) = d.schedules
    assert (schedule.schedule.cron, schedule.schedule.timezone, schedule.active) == ("0 3 * * *", "UTC", True)
    assert d.parameters["recover"] is True
    assert not read_deployment(plane, "recover-training/demo").schedules


def test_serve_creates_a_concurrency_limit_of_one_for_each_host_in_prefect_yaml(plane):
    limit = plane.api(lambda c: c.read_global_concurrency_limit_by_name("relaunch-host-localhost"))
    assert (limit.limit, limit.active) == (1, True)


def test_a_bad_target_is_refused_before_a_run_is_created_and_the_error_names_the_field(plane, tmp_path):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    def runs_of_demo() -> int:
        return plane.api(lambda c: c.count_flow_runs(deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["demo"]))))

    before = runs_of_demo()
    good = shell_target(tmp_path, name="bad").model_dump(mode="json")
    negative = {**good, "thresholds": {**good["thresholds"], "poll_interval_seconds": -1}}
    out = plane.prefect("deployment", "run", "recover-training/demo", "--param", f"target={json.dumps(negative)}")
    assert out.returncode != 0 and "'target.thresholds.poll_interval_seconds'" in squash(out.stdout + out.stderr), out.stdout + out.stderr
    missing = {k: v for k, v in good.items() if k != "repo_dir"}
    out = plane.prefect("deployment", "run", "recover-training/demo", "--params", json.dumps({"target": missing}))
    assert out.returncode != 0 and "'repo_dir' is a required property" in squash(out.stdout + out.stderr), out.stdout + out.stderr

    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: plane.api_url}), pytest.raises(Exception, match=r"target\.thresholds\.poll_interval_seconds"):
        run_deployment("recover-training/demo", parameters={"target": negative}, timeout=0)
    assert runs_of_demo() == before, "no run was created for a bad parameter"


def test_a_recovery_run_through_the_deployment_ends_healthy_and_its_report_is_readable_through_the_api(plane, tmp_path):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    target = shell_target(tmp_path, name="deployed")
    try:
        out = plane.prefect(
            "deployment",
            "run",
            "recover-training/demo",
            "--params",
            json.dumps({"target": target.model_dump(mode="json")}),
            "--watch",
            "--watch-timeout",
            "150",
            timeout=180,
        )
        assert out.returncode == 0 and "Flow run finished successfully in 'Recovered'" in out.stdout, (
            out.stdout[-3000:] + out.stderr[-3000:]
        )
        assert tmux_alive(target.tmux_session), "the worker's run left the trainer running in tmux"
    finally:
        stop_all(target)
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", out.stdout)[1]
    flow_run = plane.api(lambda c: c.read_flow_run(flow_run_id))
    assert flow_run.state.is_completed() and flow_run.name == "recover-deployed: unknown -> recovered"
    (artifact,) = plane.api(
        lambda c: c.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["recover-training-deployed"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])
            )
        )
    )
    assert artifact.type == "markdown" and "**Verdict: healthy**" in artifact.data and "full_recovery" in artifact.data


def test_the_nightly_check_hands_a_crashed_run_to_recover_training_as_a_subflow(plane, tmp_path):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterParentFlowRunId

    target = shell_target(tmp_path, name="nightly")
    try:
        launch.fn(target.model_copy(update={"env": {"EXIT_AT": "2", "EXIT_CODE": "3"}}), 1)  # crashes for real at step 2
        wait_for_exit(target)
        out = plane.prefect(
            "deployment",
            "run",
            "check-training/nightly-demo",
            "--params",
            json.dumps({"target": target.model_dump(mode="json")}),
            "--watch",
            "--watch-timeout",
            "150",
            timeout=180,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert tmux_alive(target.tmux_session)
    finally:
        stop_all(target)
    assert len(list((Path(target.state_path) / "runs").iterdir())) == 2, "relaunched once"
    check_run = re.search(r"UUID: ([0-9a-f-]{36})", out.stdout)[1]
    (subflow,) = plane.api(
        lambda c: c.read_flow_runs(flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[check_run])))
    )
    assert subflow.name == "recover-nightly: crashed (error) -> recovered" and subflow.state.is_completed()
    (artifact,) = plane.api(
        lambda c: c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["check-training-nightly"])))
    )
    assert "**Verdict: healthy**" in artifact.data and "check found crashed" in artifact.data, artifact.data


@pytest.mark.parametrize(
    "hostname, second",
    [
        ("localhost", "waits for the host's concurrency limit, then changes nothing"),
        ("127.0.0.1", "finds no limit for its host and is refused by the host-side lock"),
    ],
    ids=["server-limit", "host-lock"],
)
def test_two_recoveries_of_one_target_started_together_leave_exactly_one_trainer(plane, tmp_path, hostname, second):
    # The first recovery holds the host (slot and lock) in a warm-up that waits at a gate; the second starts
    # once the first is there, and the gate opens only once the second has been refused, or is seen waiting
    # for the host's concurrency slot (Prefect's internal debug log says so each time the server answers 423).
    gate = tmp_path / "gate"
    gate.mkdir()
    warmup = f'touch "{gate}/entered"; until [ -e "{gate}/open" ]; do sleep 0.05; done'
    target = shell_target(tmp_path, name=f"twice-{hostname.replace('.', '-')}", host=Host(hostname=hostname), warmup_command=warmup)
    spec = tmp_path / "target.yaml"
    spec.write_text(yaml.safe_dump(target.model_dump(mode="json")))
    procs: list[subprocess.Popen] = []
    errs = [tmp_path / "first.err", tmp_path / "second.err"]

    def start(i: int, **env: str) -> subprocess.Popen:
        with errs[i].open("w") as err:
            procs.append(
                subprocess.Popen(
                    [str(BIN / "relaunch"), "recover", str(spec), "--json"],
                    cwd=ROOT,
                    env=plane.env(**env),
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                )
            )
        return procs[-1]

    try:
        first = start(0)
        wait_for(lambda: (gate / "entered").exists() or first.poll() is not None, 150, "the first recovery to reach its warm-up")
        assert first.poll() is None, f"the first recovery ended before its warm-up: {errs[0].read_text()[-3000:]}"
        later = start(1, PREFECT_LOGGING_INTERNAL_LEVEL="DEBUG")
        if hostname == "localhost":
            waiting = lambda: "Unable to acquire concurrency slot" in errs[1].read_text()  # noqa: E731
            wait_for(lambda: waiting() or later.poll() is not None, 150, "the second recovery to wait for the host's concurrency slot")
            assert later.poll() is None and waiting(), f"the second {second}: {errs[1].read_text()[-3000:]}"
        else:
            wait_for(lambda: later.poll() is not None, 150, "the second recovery to be refused")
        (gate / "open").touch()
        outputs = [p.communicate(timeout=150)[0] for p in procs]
        results = [(p.returncode, out, err.read_text()) for p, out, err in zip(procs, outputs, errs)]
        running = tmux_alive(target.tmux_session)
        trainer = collect_snapshot(target)
    finally:
        (gate / "open").touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
        stop_all(target)
    runs = sorted((Path(target.state_path) / "runs").iterdir())
    assert len(runs) == 1 and running, (
        f"exactly one trainer was launched and runs: {[r.name for r in runs]}, tmux session {running}, "
        f"trainer PID alive {trainer.pid_alive}, exit code {trainer.exit_code}\n{outcomes(results)}\n{trainer.log_tail[-10:]}"
    )
    launched, other = [], []
    for code, stdout, stderr in results:
        report = json.loads(stdout) if code == 0 else None
        (launched if report and any(s["step"] == "launch" for a in report["attempts"] for s in a["steps"]) else other).append(
            (code, report, stderr)
        )
    assert len(launched) == 1 and len(other) == 1, results
    code, report, stderr = other[0]
    if hostname == "localhost":
        first = launched[0][1]
        waited = report is not None and report["started_at"] <= first["finished_at"] <= report["finished_at"]
        assert waited and [a["action"] for a in report["attempts"]] == [Action.NONE.value], f"the second {second}: {other[0]}"
    else:
        assert code == 1 and "another recovery of" in stderr, f"the second {second}: {other[0]}"


def outcomes(results: list[tuple[int, str, str]]) -> str:
    """Each recovery's exit code, its attempts as verdict -> action, and the end of its stderr: short enough to survive CI."""
    lines = []
    for i, (code, stdout, stderr) in enumerate(results):
        try:
            attempts = [f"{a['verdict']}({a.get('cause')}) -> {a['action']}" for a in json.loads(stdout)["attempts"]]
        except (ValueError, KeyError, TypeError):
            attempts = [f"stdout: {stdout[-300:]!r}"]
        lines.append(f"recovery {i + 1}: exit {code}; {'; '.join(attempts)}; stderr: {stderr[-1200:]}")
    return "\n".join(lines)


def test_the_demo_deployment_recovers_the_demo_target_and_serve_stops_it_with_its_worker_and_server_on_sigterm(plane):
    # One test, not two: prefect.yaml's demo deployment runs its trainer in the one tmux session relaunch-demo, and
    # xdist may give a module's tests to two workers, each with a plane of its own; two deployments of it at once
    # would fight over that session. What serve.sh must stop besides its worker and server: the trainer this
    # plane's deployment launched.
    out = plane.prefect("deployment", "run", "recover-training/demo", "--watch", "--watch-timeout", "400", timeout=420)
    assert out.returncode == 0 and "Flow run finished successfully in 'Recovered'" in out.stdout, out.stdout[-3000:]
    assert tmux_alive("relaunch-demo")
    assert alive(plane.server_pid) and alive(plane.worker_pid)
    start = time.monotonic()
    code = plane.stop()
    assert code == 143 and not alive(plane.server_pid) and not alive(plane.worker_pid), "\n".join(plane.output)
    assert not tmux_alive("relaunch-demo"), "serve.sh stops the demo trainer a deployment launched"
    assert any("server" in line and "stopped" in line for line in plane.output), plane.output
    assert time.monotonic() - start < 60
