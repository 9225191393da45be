"""`relaunch agent start|stop|status`: the warm agent's management (relaunch/cli/agent.py), run in-process."""

from __future__ import annotations

import sys
from collections.abc import Callable

import typer

from relaunch.cli import agent
from relaunch.cli.root import app

agent_app = typer.Typer(
    no_args_is_help=True,
    help="A warm relaunch: a process with Prefect and the flows imported, which runs every relaunch command "
    "you type (forked, with your environment, folder and terminal), so each starts in a fraction of a second "
    "instead of 1-2 s. Yours alone (a private folder, your uid); code changed since it started is never run by it.",
)
app.add_typer(agent_app, name="agent", short_help="Keep Prefect loaded, so that every command starts at once (optional).")


@agent_app.command("start")
def agent_start(
    idle_minutes: float = typer.Option(60.0, min=1.0, help="Stop after this many minutes without a command."),
) -> None:
    """Start an agent for relaunch's code as it is now (or say that one runs)."""
    _say_or_exit_1(lambda: agent.start(idle_minutes * 60))


@agent_app.command("stop")
def agent_stop() -> None:
    """Stop your agents (each finishes the commands it runs first)."""
    _say_or_exit_1(agent.stop)


def _say_or_exit_1(call: Callable[[], str]) -> None:
    """Print what CALL (one of relaunch.cli.agent's) says; its AgentError is one line on stderr and exit 1."""
    try:
        print(call())
    except agent.AgentError as exc:
        print(f"relaunch: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None


@agent_app.command("status")
def agent_status() -> None:
    """Say which agents run; exit 0 when one serves the code as it is now, 1 otherwise."""
    text, current = agent.status()
    print(text)
    raise typer.Exit(0 if current else 1)
