"""`relaunch automations sync|save-paused`: relaunch's automations put on the configured Prefect server from an
installed wheel, as `make serve` does from a clone (relaunch/cli/automations.py says what each does)."""

from __future__ import annotations

from pathlib import Path

import typer

from relaunch.cli.root import app, errors

automations_app = typer.Typer(
    help="relaunch's automations (escalations, failed nightly checks, dead-man alarms) on the configured Prefect server.",
    no_args_is_help=True,
)
app.add_typer(automations_app, name="automations")

FILE_HELP = "The automations file (default: the one relaunch ships)."


def _run(command: str, file: Path | None, paused_record: Path | None) -> None:
    from relaunch.cli.automations import main
    from relaunch.cli.deploy import require_api

    with errors():
        require_api(f"automations {command}")  # on a temporary server they would vanish with it
    argv = [command, *(["--file", str(file)] if file else []), *(["--paused-record", str(paused_record)] if paused_record else [])]
    raise typer.Exit(main(argv))


@automations_app.command("sync")
def sync_command(
    file: Path | None = typer.Option(None, "--file", help=FILE_HELP),
    paused_record: Path | None = typer.Option(None, "--paused-record", help="What save-paused recorded (default: in PREFECT_HOME)."),
) -> None:
    """Create or update every automation by name, and a dead-man alarm per nightly deployment; re-pause what
    `save-paused` recorded. Safe to run any number of times; run it after `prefect deploy`."""
    _run("sync", file, paused_record)


@automations_app.command("save-paused")
def save_paused_command(
    paused_record: Path | None = typer.Option(None, "--paused-record", help="Where to record them (default: in PREFECT_HOME)."),
) -> None:
    """Record which deployments and schedules are paused, before `prefect deploy` switches them back on."""
    _run("save-paused", None, paused_record)
