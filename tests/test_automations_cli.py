"""`relaunch automations sync`: from an installed relaunch, what `make serve` does from a clone (no scripts/ needed)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import yaml

from relaunch.cli.automations import AUTOMATIONS_FILE

RELAUNCH = str(Path(sys.executable).parent / "relaunch")


def relaunch(args: list[str], tmp_path: Path, api_url: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), DO_NOT_TRACK="1", **({"PREFECT_API_URL": api_url} if api_url else {}))
    # Outside the checkout: nothing of the clone (scripts/, a .env, prefect.toml) is in reach.
    return subprocess.run([RELAUNCH, *args], capture_output=True, text=True, env=env, timeout=180, cwd=tmp_path)


def automation_names() -> list[str]:
    from prefect.client.orchestration import get_client

    async def go() -> list[str]:
        async with get_client() as client:
            return [a.name for a in await client.read_automations()]

    return asyncio.run(go())


def test_automations_sync_puts_the_shipped_automations_on_the_configured_server_once_however_often_it_runs(prefect_harness, tmp_path):
    from prefect.settings import PREFECT_API_URL

    shipped = [a["name"] for a in yaml.safe_load(AUTOMATIONS_FILE.read_text())["automations"]]
    for _ in range(2):
        result = relaunch(["automations", "sync"], tmp_path, PREFECT_API_URL.value())
        assert result.returncode == 0, result.stdout + result.stderr
    names = automation_names()
    assert all(names.count(name) == 1 for name in shipped), names


def test_automations_sync_without_a_configured_server_refuses_says_where_to_point_it_and_names_itself_to_run_again(tmp_path):
    result = relaunch(["automations", "sync"], tmp_path, None)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no Prefect API is configured" in result.stderr and "PREFECT_API_URL" in result.stderr, result.stderr
    assert "then run `relaunch automations sync` again" in result.stderr and "deploy again" not in result.stderr, result.stderr
