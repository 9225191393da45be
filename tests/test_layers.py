"""The layers contract that `make lint` runs (scripts/check_layers.py): the core never imports upward."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "scripts" / "check_layers.py"


def copy_of_the_house(tmp_path: Path) -> Path:
    for folder in ("relaunch", "tasks", "flows", "demo"):
        (tmp_path / folder).mkdir()
        for path in (ROOT / folder).glob("*.py"):
            shutil.copy(path, tmp_path / folder / path.name)
    return tmp_path


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECK), str(root)], capture_output=True, text=True)


def test_the_house_keeps_its_layers():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_core_module_that_imports_a_task_breaks_the_contract_and_is_named(tmp_path):
    root = copy_of_the_house(tmp_path)
    config = root / "relaunch" / "config.py"
    # Deferred, inside a function: still a dependency of the core on the tasks.
    config.write_text(config.read_text() + "\n\ndef _upward():\n    from relaunch.tasks.stop import plan_stop\n\n    return plan_stop\n")
    result = lint(root)
    assert result.returncode == 1
    assert "relaunch/config.py" in result.stdout and "relaunch.config (core) imports relaunch.tasks.stop (tasks)" in result.stdout


def test_a_task_that_imports_a_flow_breaks_the_contract(tmp_path):
    root = copy_of_the_house(tmp_path)
    stop = root / "tasks" / "stop.py"
    stop.write_text(stop.read_text() + "\nimport relaunch.flows.recover  # noqa\n")
    result = lint(root)
    assert result.returncode == 1 and "relaunch.tasks.stop (tasks) imports relaunch.flows.recover (flows)" in result.stdout
