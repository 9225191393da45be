"""`python -m relaunch.cli ARGS`: the command in-process, as the `relaunch` entry point runs it without an agent."""

from relaunch.cli.startup import main

main()
