"""`relaunch recover --dry-run` and `relaunch stop` start without Prefect: the commands they run come from
relaunch.plans, which imports neither Prefect nor the tasks (issue 27). Measured as Python reports it
(PYTHONPROFILEIMPORTTIME=1: one stderr line per module imported), through the installed entry point."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import relaunch.plans
from relaunch.cli.tempserver import needs_temp_server
from relaunch.deciding.playbook import steps_for
from relaunch.testing.faults import write_target
from relaunch.testing.targets import shell_target
from relaunch.vocabulary import Action, Step

RELAUNCH = str(Path(sys.executable).parent / "relaunch")
IMPORT_TIME = "import time:"


def imported_modules(stderr: str) -> list[str]:
    """The module of each `import time: SELF | CUMULATIVE | MODULE` line (the module is indented by depth)."""
    return [line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith(IMPORT_TIME) and "|" in line]


def prefect_modules(modules: list[str]) -> list[str]:
    return [m for m in modules if m == "prefect" or m.startswith("prefect.")]


def typed_with_import_times(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    """The command as a person types it from a plain shell (no venv on PATH, no Prefect settings), import times on."""
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "PREFECT_HOME": str(home / ".prefect"), "PYTHONPROFILEIMPORTTIME": "1"}
    return subprocess.run([RELAUNCH, *args], env=env, capture_output=True, text=True, timeout=120, cwd=home)


@pytest.fixture
def target_file(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return write_target(shell_target(tmp_path / "t", name="light"), tmp_path / "home" / "target.yaml")


def test_the_dry_run_prints_the_whole_procedure_and_imports_no_prefect_module(target_file):
    result = typed_with_import_times(["recover", "--dry-run", str(target_file)], target_file.parent)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    modules = imported_modules(result.stderr)
    # The measurement itself worked: the command's own modules are listed.
    assert "relaunch.cli.dryrun" in modules and "relaunch.plans.stop" in modules
    assert prefect_modules(modules) == []
    # Same procedure as the flow runs it: the build aside, then the stop, then the launch.
    sections = [line for line in result.stdout.splitlines() if line.startswith("# ")]
    first = {name: next(i for i, line in enumerate(sections) if line.startswith(f"# {name}:")) for name in ("build_venv", "stop", "launch")}
    assert first["build_venv"] < first["stop"] < first["launch"], sections
    # The order is the playbook's (relaunch.plans.PLANS for each step), after the preflight and the leftovers' stop.
    shown = [line[2:].split(":", 1)[0] for line in sections[2:] if ":" in line]
    steps = [s for i, s in enumerate(shown) if i == 0 or shown[i - 1] != s]
    assert steps == [s.value for s in (Step.PREFLIGHT, Step.STOP_LEFTOVERS, *steps_for(Action.FULL_RECOVERY))]
    assert "# stop: stop (timeout" in result.stdout and "# launch: launch (timeout" in result.stdout
    assert "<relaunch/host/stop.sh>" in result.stdout and "<relaunch/host/launch.sh>" in result.stdout


def test_stop_stops_the_target_and_imports_no_prefect_module(target_file):
    result = typed_with_import_times(["stop", str(target_file)], target_file.parent)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "stopped (0 process(es))" in result.stdout
    modules = imported_modules(result.stderr)
    assert "relaunch.plans.stop" in modules and "relaunch.wire.transport" in modules
    assert prefect_modules(modules) == []


@pytest.mark.parametrize("argv", [["recover", "--dry-run", "target.yaml"], ["stop", "target.yaml"]])
def test_neither_light_command_starts_a_temporary_prefect_server(argv):
    assert not needs_temp_server(argv, {})


def test_no_plans_module_imports_prefect_or_the_tasks():
    names = [f"relaunch.plans.{m.name}" for m in pkgutil.iter_modules(relaunch.plans.__path__)]
    assert "relaunch.plans.stop" in names and "relaunch.plans.launch" in names
    program = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
    program += "print(sorted(m for m in sys.modules if m.split('.')[0] == 'prefect' or m.startswith(('relaunch.tasks', 'relaunch.flows'))))"
    found = subprocess.run([sys.executable, "-c", program, *names], capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"
