"""The bash that runs on a host, as real files: linted with shellcheck, readable, runnable by hand.

Each script is sent as `bash -c TEXT label ARGS...` (one round trip, no file to copy first); values reach
it only as arguments or as data it reads, never spliced into TEXT. `lib.sh`, the run-folder layout and
the /proc helpers, is inlined where a script says `. ./lib.sh`.
"""

from __future__ import annotations

import functools
from importlib.resources import files

INCLUDE = ". ./lib.sh"


@functools.cache
def host_script(name: str) -> str:
    """The text of `relaunch/host/NAME.sh`, with lib.sh inlined; a missing name is a bug, so it raises."""
    text = (files(__package__) / f"{name}.sh").read_text()
    if INCLUDE in text.splitlines():
        lib = "\n".join(
            line for line in (files(__package__) / "lib.sh").read_text().splitlines() if not line.startswith(("#!", "# shellcheck"))
        )
        text = "\n".join(lib if line == INCLUDE else line for line in text.splitlines()) + "\n"
    return text


def script_name(text: str) -> str | None:
    """Which relaunch/host script a text is (for showing commands), or None."""
    for entry in files(__package__).iterdir():
        name = entry.name.removesuffix(".sh")
        if entry.name.endswith(".sh") and name != "lib" and host_script(name) == text:
            return name
    return None
