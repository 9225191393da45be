"""`relaunch watch`: one look out per watched target, held while its trainer lives; a death starts its recovery at once."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from relaunch.cli.root import app, errors


@app.command()
def watch(
    files: list[Path] = typer.Argument(
        ..., metavar="FILE", help="Target or fleet YAML files, re-read every interval (an edit is picked up)."
    ),
    interval_seconds: float = typer.Option(10.0, "--interval-seconds", min=0.5, help="Seconds between two looks at a target."),
    rounds: int | None = typer.Option(
        None, "--rounds", min=1, help="Stop after this many looks at each target (default: until Ctrl-C or SIGTERM)."
    ),
) -> None:
    """Watch each target's trainer (its recorded PID, its exit record: a few file reads per host over one connection,
    held on the host up to --interval-seconds while it lives) and start recover-training the moment it dies. Stops nothing itself: the
    recovery's full check, locks and never-harm rules decide, as for `relaunch recover`. Ctrl-C or SIGTERM end it after
    any recovery it started."""
    import signal

    from relaunch.flows.watch import Watch

    def say(line: str) -> None:
        print(f"[watch] {line}", flush=True)

    with errors():
        w = Watch(files, say)
        w.reload()
        if not w.watched:
            print(f"relaunch: nothing to watch in {', '.join(map(str, files))}", file=sys.stderr)
            raise typer.Exit(2)
        signal.signal(signal.SIGTERM, lambda *_: w.stopping.set())
        say(f"{len(w.watched)} target(s), a look every {interval_seconds:g} s; Ctrl-C ends the watch")
        try:
            w.run(interval_seconds, rounds)
        except KeyboardInterrupt:
            w.stopping.set()
            w.finish()
