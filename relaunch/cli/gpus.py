"""`relaunch gpus [clear]`: the GPU ledger (relaunch/deciding/ledger.py, kept in Prefect Variables by relaunch/tasks/memory.py)."""

from __future__ import annotations

import sys

import typer

from relaunch.cli.root import app, errors, print_json

# ---- relaunch gpus: the GPU ledger (relaunch/deciding/ledger.py, kept in Prefect Variables by relaunch/tasks/memory.py) ----
gpus_app = typer.Typer(
    help="The GPU ledger: each GPU that failed under a target (Xid, ECC, off the bus), per host, never given back to a relaunch until cleared."
)
app.add_typer(gpus_app, name="gpus", short_help="List the GPU ledger, or clear a GPU from it after a repair.")


@gpus_app.callback(invoke_without_command=True)
def gpus(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="One JSON list of ledger rows.")) -> None:
    """List every GPU in the ledger, on every host."""
    if ctx.invoked_subcommand:
        return
    from prefect.client.orchestration import get_client

    from relaunch.tasks.memory import all_ledgers

    with errors(as_json):
        with get_client(sync_client=True) as client:
            rows = [row for ledger in all_ledgers(client) for row in ledger.rows()]
    if as_json:
        print_json(rows)
        raise typer.Exit(0)
    if not rows:
        print("the GPU ledger is empty: no GPU is kept from a relaunch")
    for r in rows:
        gpu = f"GPU {r['index']}" if r["index"] is not None else "GPU ?"
        print(
            f"{r['host']:<24} {r['bus_id']:<18} {gpu:<6} {r['uuid'] or '-':<40} {r['reason']} (since {r['first_seen']}, seen {r['times']}x, {r['target']})"
        )
    raise typer.Exit(0)


@gpus_app.command("clear")
def gpus_clear(
    host: str = typer.Argument(..., help="The host's name as its targets give it (`host.hostname`)."),
    bus_id: str = typer.Argument(..., help="The GPU's PCI bus id (00000000:3B:00.0 or 0000:3b:00, as `relaunch gpus` lists it)."),
) -> None:
    """Take a repaired or replaced GPU out of the ledger: relaunches may use it again."""
    from prefect.client.orchestration import get_client

    from relaunch.tasks.memory import read_ledger, write_ledger

    with errors():
        with get_client(sync_client=True) as client:
            ledger, removed = read_ledger(client, host).without(bus_id)
            if removed is not None:
                write_ledger(client, ledger)
    if removed is None:
        print(f"relaunch: no GPU at {bus_id} in the ledger of {host} (`relaunch gpus` lists it)", file=sys.stderr)
        raise typer.Exit(1)
    print(f"cleared {removed.name()} on {host}: relaunches may use it again")
