"""The layers contract that `make lint` runs (scripts/check_layers.py): the core never imports upward, and scripts,
bench and the package import nothing from tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "scripts" / "check_layers.py"


def copy_of_the_house(tmp_path: Path) -> Path:
    for folder in ("tasks", "flows", "demo"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        for path in (ROOT / folder).glob("*.py"):
            shutil.copy(path, tmp_path / folder / path.name)
    for folder in ("relaunch", "scripts", "bench"):  # every .py file, in folders below too (the core's rooms, the CLI)
        for path in (ROOT / folder).rglob("*.py"):
            copy = tmp_path / path.relative_to(ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, copy)
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
    assert "relaunch/config.py" in result.stdout and "relaunch.config (foundation) imports relaunch.tasks.stop (tasks)" in result.stdout


def test_a_task_that_imports_a_flow_breaks_the_contract(tmp_path):
    root = copy_of_the_house(tmp_path)
    stop = root / "tasks" / "stop.py"
    stop.write_text(stop.read_text() + "\nimport relaunch.flows.recover  # noqa\n")
    result = lint(root)
    assert result.returncode == 1 and "relaunch.tasks.stop (tasks) imports relaunch.flows.recover (flows)" in result.stdout


@pytest.mark.parametrize("where", ["tests/test_x.py", "bench/x.py", "flows/x.py", "relaunch/cli/x.py"])
@pytest.mark.parametrize("name", ["flows.recover", "tasks.stop", "demo.scenarios"])
def test_a_top_level_folder_imported_by_its_bare_name_breaks_the_contract_wherever_it_is(tmp_path, where, name):
    # One import name per module: `flows.recover` beside `relaunch.flows.recover` is a second copy with its own tables.
    root = copy_of_the_house(tmp_path)
    path = root / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"from {name} import x  # noqa\n")
    result = lint(root)
    assert result.returncode == 1 and f"{where}:1: imports {name}: import it as relaunch.{name}" in result.stdout, result.stdout


# (file, what it gains, the words the contract must say): an upward import in every layer, the plans' and a relative one.
UPWARD = [
    ("relaunch/plans/stop.py", "from relaunch.tasks.stop import stop", "relaunch.plans.stop (plans) imports relaunch.tasks.stop (tasks)"),
    (
        "relaunch/judging/diagnosis.py",
        "from relaunch.cli.app import app",
        "relaunch.judging.diagnosis (judging) imports relaunch.cli.app (wing)",
    ),
    # The core's rooms, each against the room above it.
    (
        "relaunch/config.py",
        "from relaunch.wire.commands import Command",
        "relaunch.config (foundation) imports relaunch.wire.commands (wire)",
    ),
    (
        "relaunch/wire/ssh.py",
        "from relaunch.judging.snapshot import GpuApp",
        "relaunch.wire.ssh (wire) imports relaunch.judging.snapshot (judging)",
    ),
    (
        "relaunch/judging/gone.py",
        "from relaunch.plans.stop import plan_stop",
        "relaunch.judging.gone (judging) imports relaunch.plans.stop (plans)",
    ),
    (
        "relaunch/plans/health.py",
        "from relaunch.deciding.checkpoints import step_of",
        "relaunch.plans.health (plans) imports relaunch.deciding.checkpoints (deciding)",
    ),
    (
        "relaunch/deciding/history.py",
        "from relaunch.records.report import Report",
        "relaunch.deciding.history (deciding) imports relaunch.records.report (records)",
    ),
    (
        "relaunch/records/goodput.py",
        "from relaunch.tasks.goodput import read",
        "relaunch.records.goodput (records) imports relaunch.tasks.goodput (tasks)",
    ),
    # Relative, from a room to the room above it: `from ..deciding import gang` in relaunch.judging is relaunch.deciding.
    ("relaunch/judging/alive.py", "from ..deciding import gang", "relaunch.judging.alive (judging) imports relaunch.deciding (deciding)"),
    ("tasks/stop.py", "from relaunch.demo import scenarios", "relaunch.tasks.stop (tasks) imports relaunch.demo (demo)"),
    ("flows/check.py", "from relaunch.cli import status", "relaunch.flows.check (flows) imports relaunch.cli (wing)"),
    ("demo/__init__.py", "import relaunch.cli.app", "relaunch.demo (demo) imports relaunch.cli.app (wing)"),
    # Relative, from the plans' own package: `from ..tasks import stop` is relaunch.tasks.
    ("relaunch/plans/launch.py", "from ..tasks import stop", "relaunch.plans.launch (plans) imports relaunch.tasks (tasks)"),
    (
        "relaunch/deciding/checkpoints.py",
        "from prefect import task",
        "relaunch.deciding.checkpoints (deciding, core) imports prefect: the core imports no Prefect",
    ),
    ("relaunch/plans/doctor.py", "import prefect.blocks.system", "the core imports no Prefect"),
    ("relaunch/wire/ssh.py", "from prefect.blocks.system import Secret", "relaunch.wire.ssh (wire, core) imports prefect.blocks.system"),
    # The helpers the tests, bench, scripts and the multi-node demo share: the demo's rank, below the wing.
    ("relaunch/testing/targets.py", "from relaunch.cli import app", "relaunch.testing.targets (testing) imports relaunch.cli (wing)"),
    # Scripts and bench (in folders below too) import nothing from tests, deferred or not.
    (
        "bench/gpu_multirank/scenario.py",
        "import tests.targets",
        "imports tests.targets: scripts, bench and the package import no tests; shared helpers live in relaunch.testing",
    ),
    (
        "scripts/scale_demo.py",
        "from tests.faults import wait_for",
        "imports tests.faults: scripts, bench and the package import no tests; shared helpers live in relaunch.testing",
    ),
]


@pytest.mark.parametrize(("file", "line", "said"), UPWARD, ids=[f"{f}:{line}" for f, line, _ in UPWARD])
def test_an_upward_import_or_prefect_in_the_core_breaks_the_contract_in_every_layer(tmp_path, file, line, said):
    root = copy_of_the_house(tmp_path)
    path = root / file
    path.write_text(path.read_text() + f"\n\ndef _upward():\n    {line}  # noqa\n")
    result = lint(root)
    assert result.returncode == 1, result.stdout
    assert said in result.stdout and file in result.stdout, result.stdout
