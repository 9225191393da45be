"""The bash that runs on a host, as real files: linted with shellcheck, readable, runnable by hand.

Each script is sent as `bash -c TEXT label ARGS...` (one round trip, no file to copy first); values reach
it only as arguments or as data it reads, never spliced into TEXT. A shared file is inlined where a script
says `. ./NAME.sh`: `lib.sh` (the run-folder layout and the /proc helpers) and `panes.sh` (the target's
session panes and process trees, for the poll and the adoption).
"""

from __future__ import annotations

import functools
import re
from importlib.resources import files

INCLUDE = re.compile(r"^\. \./(?P<name>[a-z_]+)\.sh$")
# Shared files, never sent on their own (script_name skips them).
SHARED = ("lib", "panes", "recorder")


@functools.cache
def host_script(name: str) -> str:
    """The text of `relaunch/host/NAME.sh`, each `. ./SHARED.sh` line replaced by that file's text; a missing name
    is a bug, so it raises."""
    lines = []
    for line in (files(__package__) / f"{name}.sh").read_text().splitlines():
        m = INCLUDE.match(line)
        lines.append(_shared(m["name"]) if m else line)
    return "\n".join(lines) + "\n"


@functools.cache
def _shared(name: str) -> str:
    text = (files(__package__) / f"{name}.sh").read_text()
    return "\n".join(line for line in text.splitlines() if not line.startswith(("#!", "# shellcheck")))


def script_name(text: str) -> str | None:
    """Which relaunch/host script a text is (for showing commands), or None."""
    for entry in files(__package__).iterdir():
        name = entry.name.removesuffix(".sh")
        if entry.name.endswith(".sh") and name not in SHARED and host_script(name) == text:
            return name
    return None
