"""One target's host outside the flows: rollback-venv puts the previous venv back, doctor says whether it is sane."""

from __future__ import annotations

from pathlib import Path

import typer

from relaunch.cli.root import app, errors, one_host, print_json, reach
from relaunch.config import load_target


@app.command("rollback-venv")
def rollback_venv_command(target_file: Path = typer.Argument(..., help="Target YAML.")) -> None:
    """Put the previous venv back (the newest VENV.old-*); the current one is kept as VENV.rolled-back-*."""
    from relaunch.tasks.rollback_venv import rollback_venv

    with errors():
        step = rollback_venv.fn(reach(one_host(load_target(target_file), "rollback-venv")))
    print(f"restored {step.detail.restored_from}; the replaced venv is kept as {step.detail.rolled_back_to}")


@app.command()
def doctor(
    target_file: Path = typer.Argument(..., help="Target YAML."),
    as_json: bool = typer.Option(False, "--json", help="Print every check (name, status, detail, advice) as JSON."),
) -> None:
    """Say whether the target is reachable and sane, one line per check with what to do: every hop and its host key, the
    container, tmux, git, uv, nvidia-smi and the GPUs, free disk, writable folders, the lock, the Prefect API. Changes
    nothing (records no host key). Exit 0 only when every check passes; the first command to run on a new target."""
    from relaunch.cli.doctor import examine
    from relaunch.cli.tempserver import configured_api_url
    from relaunch.plans.doctor import passed, render

    with errors(as_json):
        target = one_host(load_target(target_file), "doctor")
        checks = examine(target, configured_api_url())
    if as_json:
        print_json(
            {
                "target": target.name,
                "host": target.host.label,
                "passed": passed(checks),
                "checks": [c.model_dump(mode="json") for c in checks],
            }
        )
    else:
        print(render(target, checks))
    raise typer.Exit(0 if passed(checks) else 1)
