"""`relaunch ... --help` is read where relaunch is installed from its wheel: it cites no file only a clone has."""

from __future__ import annotations

import re

import typer
from typer.testing import CliRunner

from relaunch.cli.app import app

# A path into the repository: docs/, tests/, scripts/, bench/ (the wheel ships none of them).
CLONE_ONLY = re.compile(r"\b(?:docs|tests|scripts|bench)/[\w./-]+")


def command_paths(group: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group under GROUP (a click group, as Typer builds it: its own click, so read by shape)."""
    paths = [prefix]
    for name, command in getattr(group, "commands", {}).items():
        paths += command_paths(command, (*prefix, name)) if hasattr(command, "commands") else [(*prefix, name)]
    return paths


def test_no_help_text_of_any_command_cites_a_file_only_a_clone_has():
    paths = command_paths(typer.main.get_command(app))
    assert ("automations", "sync") in paths and ("demo",) in paths, paths
    cited = {}
    for path in paths:
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "300"})
        assert result.exit_code == 0, (path, result.output)
        if found := CLONE_ONLY.findall(result.output):
            cited[" ".join(path)] = found
    assert not cited, cited
