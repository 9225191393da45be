"""The control plane as services: the systemd units and the compose file `relaunch services` writes, checked by
systemd's own verifier and against the settings `make scale-demo` runs with (scripts/scale_demo.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_scale_demo import load_scale_demo

BIN = Path(sys.executable).parent


def services(tmp_path: Path, *args: str) -> Path:
    out = subprocess.run([str(BIN / "relaunch"), "services", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return tmp_path


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (apt-get install systemd)")
def test_the_server_and_worker_units_pass_systemd_analyze_verify_and_run_this_installs_prefect(tmp_path):
    services(tmp_path, "--systemd", str(tmp_path), "--user", "root", "--pool", "gpu-pool")
    units = sorted(tmp_path.glob("*.service"))
    assert [u.name for u in units] == ["prefect-server.service", "relaunch-worker.service"]
    verified = subprocess.run(["systemd-analyze", "verify", *map(str, units)], capture_output=True, text=True, timeout=60)
    # verify exits 0 on warnings too: anything it says about these units is a fault in them.
    complaints = [line for line in (verified.stdout + verified.stderr).splitlines() if any(u.name in line for u in units)]
    assert verified.returncode == 0 and not complaints, verified.stdout + verified.stderr
    worker = (tmp_path / "relaunch-worker.service").read_text()
    assert f"ExecStart={BIN}/prefect worker start --pool gpu-pool --type process" in worker
    assert "KillSignal=SIGINT" in worker and "Environment=PREFECT_API_URL=http://127.0.0.1:4200/api" in worker


def test_the_compose_file_runs_the_server_and_workers_with_the_settings_of_the_scale_demo(tmp_path):
    services(tmp_path, "--compose", str(tmp_path))
    spec = yaml.safe_load((tmp_path / "compose.yaml").read_text())
    assert set(spec["services"]) == {"postgres", "redis", "server", "worker"}
    sd = load_scale_demo()
    demo = sd.server_settings(sd.Postgres(1, "pw", "postgresql+asyncpg://x"), sd.Redis(2, "pw"), "relaunch:pw", ui=True)
    server = spec["services"]["server"]["environment"]
    assert set(demo) <= set(server), f"settings the scale demo's server has and the compose server lacks: {set(demo) - set(server)}"
    secret = {
        "PREFECT_SERVER_DATABASE_CONNECTION_URL",
        "PREFECT_REDIS_MESSAGING_URL",
        "PREFECT_SERVER_DOCKET_URL",
        "PREFECT_SERVER_API_AUTH_STRING",
    }
    assert {k: server[k] for k in demo if k not in secret} == {k: v for k, v in demo.items() if k not in secret}
    assert server["PREFECT_SERVER_DOCKET_URL"].endswith("/1") and server["PREFECT_REDIS_MESSAGING_URL"].endswith("/0")

    client = sd.client_env("http://server:4200/api", "relaunch:pw", tmp_path / "home")
    worker = spec["services"]["worker"]
    env = worker["environment"]
    for key in ("PREFECT_WORKER_QUERY_SECONDS", "PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "DO_NOT_TRACK"):
        assert env[key] == client[key], key
    assert {"PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "PREFECT_RESULTS_LOCAL_STORAGE_PATH"} <= set(
        env
    ) and "PREFECT_RESULTS_LOCAL_STORAGE_PATH" in client
    # Results every worker reads: the storage path is a volume shared by all of them.
    assert f"results:{env['PREFECT_RESULTS_LOCAL_STORAGE_PATH']}" in worker["volumes"] and "results" in spec["volumes"]
    assert worker["stop_signal"] == "SIGINT"
    secrets = dict(line.split("=", 1) for line in (tmp_path / ".env").read_text().split())
    assert set(secrets) == {"POSTGRES_PASSWORD", "REDIS_PASSWORD", "PREFECT_AUTH"} and (tmp_path / ".env").stat().st_mode & 0o077 == 0
