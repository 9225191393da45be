"""`relaunch demo` as a new user meets it: the incident's fault by default, its own session name, and a clear word
where torch is missing (relaunch itself runs without torch; its demo trains a real model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RELAUNCH = str(Path(sys.executable).parent / "relaunch")


def relaunch(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "DO_NOT_TRACK": "1", **env}
    environ.pop("PREFECT_API_URL", None)
    return subprocess.run([RELAUNCH, *args], capture_output=True, text=True, env=environ, timeout=300, cwd=tmp_path)


def test_a_demo_without_torch_says_how_to_get_it_and_exits_2_before_it_builds_anything(tmp_path):
    # An interpreter without torch, as a wheel installed without its demo extra is: `import torch` fails as it would.
    hidden = tmp_path / "no-torch"
    hidden.mkdir()
    (hidden / "torch.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    result = relaunch(["demo", "--workdir", str(tmp_path / "demo"), "--device", "cpu"], tmp_path, PYTHONPATH=str(hidden))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "pip install 'relaunch[demo]'" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "demo").exists()


def test_the_demo_breaks_the_run_with_the_incidents_fault_by_default_and_takes_a_session_name(tmp_path):
    result = relaunch(["demo", "--help"], tmp_path, COLUMNS="200")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "--name" in text and "default: fx-race" in text.lower(), text
