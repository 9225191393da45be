"""`relaunch`: the one Typer app (relaunch/cli/root.py) with every command group registered on it. The process that
runs it is relaunch/cli/startup.py's.

    demo.py            demo
    recovery.py        diagnose, check, recover, stop, adopt, logs, fleet
    control.py         deploy, undeploy, status, services, goodput
    host_tools.py      rollback-venv, doctor
    agent_commands.py  agent start|stop|status
    gpus.py            gpus, gpus clear
    automations_commands.py  automations sync|save-paused
    watch_commands.py  watch
    docs_commands.py   docs
"""

from __future__ import annotations

# Importing a group registers its commands on the app: `relaunch --help` lists them in the order of these imports.
# isort: off
from relaunch.cli import demo, recovery, control, host_tools, agent_commands, gpus, automations_commands, watch_commands, docs_commands  # noqa: F401

# isort: on
from relaunch.cli.root import app

__all__ = ["app"]
