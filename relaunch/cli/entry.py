"""The `relaunch` command: through a running agent when there is one for this code, else in this process.

Standard library only up to the hand-over: with an agent (relaunch/cli/agent.py) a command starts in a fraction of
a second, without one it costs what it did (relaunch.cli imports Prefect and the flows).
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    argv = sys.argv[1:]
    # `relaunch agent ...` manages agents, so it never runs in one; --help and --version need no Prefect at all.
    from relaunch.cli.tempserver import command_of  # standard library only, as this module

    if command_of(argv) != "agent" and "--help" not in argv and "--version" not in argv:
        from relaunch.cli.agent import delegate

        code = delegate(argv)
        if code is not None:
            sys.stdout.flush()
            os._exit(code)
    from relaunch.cli.startup import main as in_process

    in_process()


if __name__ == "__main__":
    main()
