"""The CLI as a new user types it, from a plain shell: shared by the tests of `status` and of a Prefect API that does
not answer (one definition, not a copy per file)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from relaunch.testing.faults import making

RELAUNCH = str(Path(sys.executable).parent / "relaunch")


def typed(args: list[str], home: Path, api_url: str | None = None) -> subprocess.CompletedProcess:
    """The CLI from `env -i HOME=... PATH=/usr/bin:/bin` (no venv on PATH, no agent), with API_URL as PREFECT_API_URL."""
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "PREFECT_HOME": str(home / ".prefect"), "RELAUNCH_AGENT": "off"}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return subprocess.run([RELAUNCH, *args], env=env, capture_output=True, text=True, timeout=180, cwd=home)


@pytest.fixture
def made(tmp_path: Path) -> Iterator:
    with making(tmp_path) as make:
        yield make


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"
