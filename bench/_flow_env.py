"""Imported first by benchmarks that run relaunch's flows: their own PREFECT_HOME, no telemetry, quiet logs, the
venv's tools (uv, relaunch) on PATH, and the repository importable. Before Prefect is imported, so its settings see it."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# After the installed package: the checkout's top-level relaunch/ lacks relaunch.flows/tasks/demo (package-dir), so it
# must not shadow an install (the venv's, or the GPU machine's laid-out tree); ROOT is here for `tests`.
sys.path.append(str(ROOT))
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="relaunch-prefect-"))
os.environ.update(DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ["PATH"] = f"{os.environ['PATH']}{os.pathsep}{Path(sys.executable).parent}"
