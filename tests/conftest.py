"""Shared test set-up: an isolated Prefect home, no telemetry, the project venv's tools (uv) on PATH."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

_HOME = tempfile.mkdtemp(prefix="relaunch-prefect-")
os.environ["PREFECT_HOME"] = _HOME
os.environ["DO_NOT_TRACK"] = "1"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_LOGGING_LEVEL"] = os.environ.get("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def prefect_harness():
    """One real (temporary) Prefect server for the whole session: ~7 s once, not per test."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        yield
