#!/usr/bin/env python3
"""The layers contract (`make lint`): each layer imports only the layers below it.

    application wing  relaunch.cli, relaunch.cli.entry, relaunch.cli.agent, relaunch.cli.dryrun
    demo              relaunch.demo      (demo/)
    testing           relaunch.testing   (relaunch/testing/: what the tests, bench, scripts and the multi-node demo
                      share); the demo's rank: the demo imports it and it imports relaunch.demo.wheels
    flows             relaunch.flows     (flows/: order and branch)
    tasks             relaunch.tasks     (tasks/: one module per recovery step)
    core, its rooms from the top down (pure; never imports Prefect: what needs it is set from above, tasks/secrets.py):
      records         relaunch.records   (what a person is told and what is kept: report, goodput, the dead-man alarm)
      deciding        relaunch.deciding  (what to do: playbook, checkpoints, ledger, history, gang, incidents, decide)
      plans           relaunch.plans     (each step's host commands and the parsers of what they print)
      judging         relaunch.judging   (what the evidence says: snapshot, log text, signatures, diagnosis, ...)
      wire            relaunch.wire      (commands as data, transports, SSH)
      foundation      every other relaunch.* module: the vocabulary, the target's config, paths, errors, step
                      details, the run folder's layout, and relaunch.host's scripts

Every import counts, also one inside a function (a deferred import is still a dependency). Read with `ast`, so
nothing is imported to check it. A second rule: scripts/, bench/ (every .py file, recursively) and the package's
folders import nothing from `tests` (shared helpers live in relaunch.testing, as Prefect ships `prefect.testing`).
`python scripts/check_layers.py [ROOT]` exits 1 naming each upward import and each import of tests.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

WING = frozenset({"relaunch.cli", "relaunch.cli.entry", "relaunch.cli.agent", "relaunch.cli.dryrun"})
# Folder in the checkout -> the package it installs as (pyproject's package-dir).
FOLDERS = {
    "relaunch": "relaunch",
    "relaunch/cli": "relaunch.cli",
    "relaunch/plans": "relaunch.plans",
    "relaunch/wire": "relaunch.wire",
    "relaunch/judging": "relaunch.judging",
    "relaunch/deciding": "relaunch.deciding",
    "relaunch/records": "relaunch.records",
    "tasks": "relaunch.tasks",
    "flows": "relaunch.flows",
    "demo": "relaunch.demo",
    "relaunch/testing": "relaunch.testing",
}
# The core's rooms rank below the tasks; a room imports only the rooms below it.
CORE = ("foundation", "wire", "judging", "plans", "deciding", "records")
RANK = {**{room: rank for rank, room in enumerate(CORE)}, "tasks": 6, "flows": 7, "demo": 8, "testing": 8, "wing": 9}
# Folders whose every .py file (recursively) the second rule (no import of tests) holds, beside the package's (FOLDERS).
NO_TESTS = ("scripts", "bench")


def layer(module: str) -> str:
    for name in ("tasks", "flows", "demo", "testing", *CORE[1:]):
        if module == f"relaunch.{name}" or module.startswith(f"relaunch.{name}."):
            return name
    return "wing" if module == "relaunch.cli" or module.startswith("relaunch.cli.") else "foundation"


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).glob("*.py")):
            out[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return out


def imported(path: Path, module: str) -> list[tuple[int, str]]:
    """The relaunch modules MODULE imports (relative imports resolved)."""
    return [(line, name) for line, name in imports(path, module) if name == "relaunch" or name.startswith("relaunch.")]


def imports(path: Path, module: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's own package
                base = module.rsplit(".", node.level)[0]
                found.append((node.lineno, f"{base}.{node.module}" if node.module else base))
            elif node.module:
                found.append((node.lineno, node.module))
    return found


# The top-level folders pyproject's package-dir installs under relaunch (relaunch.flows, ...): never imported bare.
TOP_LEVEL = ("flows", "tasks", "demo")


def importers_of_tests(root: Path) -> dict[Path, str]:
    """Every .py file the second rule (no import of tests) holds for: scripts/ and bench/ recursively, and the package's modules."""
    files = {
        path: path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
        for f in NO_TESTS
        for path in sorted((root / f).rglob("*.py"))
    }
    files.update({path: module for module, path in modules(root).items()})
    return files


def violations(root: Path) -> list[str]:
    out = []
    for path, module in importers_of_tests(root).items():
        for line, name in imports(path, module):
            if name == "tests" or name.startswith("tests."):
                out.append(
                    f"{path.relative_to(root)}:{line}: imports {name}: scripts, bench and the package import no tests; shared helpers live in relaunch.testing"
                )
    # One import name per module: flows/, tasks/ and demo/ sit at the top level (the design card) and install as
    # relaunch.flows, relaunch.tasks, relaunch.demo; imported as `flows.x` they load a second copy of the module (its own
    # tables, Prefect patched twice), and plain `pytest` cannot collect the file.
    for path in sorted(p for f in (*NO_TESTS, "tests", "relaunch", *TOP_LEVEL) for p in (root / f).rglob("*.py")):
        for line, name in imports(path, path.relative_to(root).with_suffix("").as_posix().replace("/", ".")):
            if name.split(".")[0] in TOP_LEVEL:
                out.append(f"{path.relative_to(root)}:{line}: imports {name}: import it as relaunch.{name} (its one import name)")
    for module, path in modules(root).items():
        for line, name in imported(path, module):
            if RANK[layer(name)] > RANK[layer(module)]:
                out.append(f"{path.relative_to(root)}:{line}: {module} ({layer(module)}) imports {name} ({layer(name)}), a layer above it")
        if layer(module) in CORE:
            # The core runs without Prefect (the dry run, `relaunch stop`, a library caller): what needs it is a task's.
            for line, name in imports(path, module):
                if name == "prefect" or name.startswith("prefect."):
                    out.append(
                        f"{path.relative_to(root)}:{line}: {module} ({layer(module)}, core) imports {name}: the core imports no Prefect"
                    )
    return out


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    found = violations(root)
    for line in found:
        print(line)
    if found:
        print(
            f"layers contract broken: {len(found)} upward import(s) or import(s) of tests; see scripts/check_layers.py for the layers",
            file=sys.stderr,
        )
        return 1
    print(
        f"layers contract kept: {len(modules(root))} modules, {' < '.join(CORE)} < tasks < flows < demo = testing < application wing; "
        f"{len(importers_of_tests(root))} files of scripts, bench and the package import no tests"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
