"""The control plane and what it records: deploy, undeploy, services; status and goodput from the server's records."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import typer

from relaunch.cli.root import app, errors, print_json
from relaunch.config import load_target
from relaunch.errors import ConfigError


@app.command("deploy")
def deploy_command(
    target_file: Path = typer.Argument(..., help="Target YAML, or a target's name in ~/.config/relaunch/targets."),
    cron: str = typer.Option("0 3 * * *", "--cron", help="When the nightly check runs (cron, in --timezone)."),
    timezone: str = typer.Option("UTC", "--timezone", help="The time zone the cron schedule is read in (IANA name, e.g. Europe/Berlin)."),
    pool: str = typer.Option("relaunch", "--pool", help="The work pool both deployments run on (a process pool is created when missing)."),
    watch: bool = typer.Option(
        False, "--watch", help="Also deploy the watch (watch-training/watch-NAME): a death is recovered within seconds."
    ),
    watch_interval_seconds: float = typer.Option(10.0, "--watch-interval-seconds", min=0.5, help="With --watch: seconds between looks."),
    as_json: bool = typer.Option(False, "--json", help="Print what was deployed as JSON."),
) -> None:
    """Create or update the target's nightly check (`check-training/nightly-NAME`) and its recovery on demand
    (`recover-training/NAME`) from the installed package, the host's concurrency limit and the automations that tell a
    person. Run it again after editing the target file: nothing is duplicated, a paused schedule stays paused."""
    from relaunch.cli.deploy import deploy
    from relaunch.config import target_file as resolve

    with errors(as_json):
        path = resolve(target_file).resolve()
        say = (lambda line: None) if as_json else print
        done = deploy(
            load_target(path), path, cron, timezone, pool, say=say, watch_interval_seconds=watch_interval_seconds if watch else None
        )
    if as_json:
        print_json(done.model_dump(mode="json"))
    else:
        print(
            f"deployed {done.target}: a worker on pool {done.pool!r} (`pip install relaunch`, then `prefect worker start --pool {done.pool}`) runs them;\n"
            f"  now: prefect deployment run '{done.recover_deployment}' --watch"
        )


@app.command("undeploy")
def undeploy_command(
    target: str = typer.Argument(..., help="The target's name (or its target file)."),
    as_json: bool = typer.Option(False, "--json", help="Print the deleted deployments as JSON."),
) -> None:
    """Delete the target's two deployments and, when no other target uses its host, the host's concurrency limit.
    Runs already going finish; the host and the automations are not touched."""
    from relaunch.cli.deploy import undeploy

    with errors(as_json):
        name = load_target(target).name if Path(target).suffix in (".yaml", ".yml") or "/" in target else target
        removed = undeploy(name, say=(lambda line: None) if as_json else print)
    if as_json:
        print_json({"target": name, "deleted": removed})


@app.command("status")
def status_command(
    fleet_file: Path | None = typer.Argument(
        None,
        help="A target YAML (or a target's name in ~/.config/relaunch/targets), or a fleet YAML (as for `relaunch fleet`); "
        "default: every target in ~/.config/relaunch/targets.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
) -> None:
    """One line per target: its run now, from one cheap look at its host (running, dead with its exit code and since
    when, stopped, not launched, unreachable), beside the Prefect server's records: the last report, the last recovery,
    last night's goodput where a flow publishes it, the nightly schedule. Without a Prefect API, what the hosts know.
    Changes nothing. Exit 0 when every run is fine now (running, stopped, or ended with exit 0), else 1."""
    from datetime import UTC, datetime

    from relaunch.cli.root import ApiUnanswered, api_unanswered
    from relaunch.cli.status import gather, look_all, render, row
    from relaunch.cli.tempserver import API_ANSWER_SECONDS, api_health, configured_api_url
    from relaunch.config import load_targets, target_names, targets_folder

    with errors(as_json):
        if fleet_file is not None:
            targets = load_targets(fleet_file)
        else:
            targets = [load_target(name) for name in target_names()]
            if not targets:
                raise ConfigError(f"no targets in {targets_folder()}: save target files there as NAME.yaml, or give a fleet file")
        with ThreadPoolExecutor(max_workers=1) as hosts:
            looking = hosts.submit(look_all, targets)  # the hosts are looked at while the server is read
            url, down, rows = configured_api_url() or None, None, None
            if url:
                try:
                    problem = api_health(url, API_ANSWER_SECONDS)
                    if problem is not None:
                        raise ApiUnanswered(url, problem.what, hung=problem.timed_out)
                    rows = gather(targets)
                except Exception as exc:  # noqa: BLE001 - only the API's own silence is kept for after the hosts' rows
                    down = exc if isinstance(exc, ApiUnanswered) else api_unanswered(exc, url)
                    if down is None:
                        raise
            nows = looking.result()
        if rows is None:
            rows = [row(t, [], [], None, None, now) for t, now in zip(targets, nows, strict=True)]
        else:
            rows = [r.model_copy(update={"now": now}) for r, now in zip(rows, nows, strict=True)]
        if as_json and down is None:
            print_json([r.model_dump(mode="json") for r in rows])
        elif not as_json:
            print(render(rows, datetime.now(UTC), records=down is None and url is not None))
        if down is not None:
            raise down
    if url is None:
        print(
            "relaunch: no Prefect API is configured: NOW is from the hosts alone; the last reports, recoveries and "
            "schedules are on your Prefect server (export PREFECT_API_URL=http://HOST:4200/api)",
            file=sys.stderr,
        )
    raise typer.Exit(0 if all(r.now is not None and r.now.fine for r in rows) else 1)


@app.command("services")
def services_command(
    systemd: Path | None = typer.Option(
        None, "--systemd", help="Write prefect-server.service and relaunch-worker.service into this folder."
    ),
    compose: Path | None = typer.Option(
        None,
        "--compose",
        help="Write compose.yaml (PostgreSQL, Redis, server, worker) and .env (random secrets, if none) into this folder.",
    ),
    user: str = typer.Option("prefect", "--user", help="The system user the units run as (create it: useradd --system prefect)."),
    host: str = typer.Option("127.0.0.1", "--host", help="The address the server listens on."),
    port: int = typer.Option(4200, "--port", help="The port the server listens on."),
    pool: str = typer.Option("relaunch", "--pool", help="The work pool the worker polls."),
    api_url: str | None = typer.Option(None, "--api-url", help="The API the worker unit talks to (default: the server unit's)."),
) -> None:
    """Write the control plane as services: systemd units for a Prefect server and a relaunch worker, and a compose
    file for the scale-out set-up (PostgreSQL, Redis, a server, workers). They run the relaunch installed here."""
    from relaunch.cli.services import values, write_compose, write_systemd

    if systemd is None and compose is None:
        print("relaunch: give --systemd DIR, --compose DIR, or both", file=sys.stderr)
        raise typer.Exit(2)
    with errors():
        filled = values(user, host, port, pool, api_url)
        written = (write_systemd(systemd, filled) if systemd else []) + (write_compose(compose, filled) if compose else [])
    for path in written:
        print(f"wrote {path}")


# ---- goodput: where a target's time went (relaunch/records/goodput.py; docs/goodput.md) ----------------------------------
@app.command()
def goodput(
    target: str = typer.Argument(..., help="Target YAML, or the target's name as its runs recorded it."),
    days: float = typer.Option(7.0, "--days", min=0.01, help="How many days back from now."),
    as_json: bool = typer.Option(False, "--json", help="Seconds per category, per UTC night and in total, and the segments."),
) -> None:
    """Productive training time and lost time by category, per night and in total, from what relaunch recorded in Prefect."""
    from datetime import UTC, datetime, timedelta

    from relaunch.records import goodput as gp
    from relaunch.tasks.goodput import collect_timeline

    with errors(as_json):
        name = load_target(Path(target)).name if target.endswith((".yaml", ".yml")) or Path(target).is_file() else target
        now = datetime.now(UTC)
        result = gp.report(collect_timeline.fn(name, now - timedelta(days=days), now), days, now)
    print(json.dumps(result.model_dump(mode="json"), indent=2) if as_json else gp.text_table(result))
    raise typer.Exit(0)
