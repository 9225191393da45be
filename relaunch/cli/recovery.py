"""A target's run: diagnose a saved log, check, recover, stop, adopt, logs; and fleet, many targets at once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from relaunch.cli.root import (
    JSON_HELP,
    app,
    confirm,
    errors,
    exit_for,
    one_host,
    print_json,
    print_report,
    reach,
    run_flow,
    stop_target,
    untraced,
)
from relaunch.config import Thresholds, load_target
from relaunch.errors import ConfigError


@app.command()
def diagnose(
    log: Path = typer.Argument(..., help="A saved trainer log."),
    exit_code: int | None = typer.Option(None, help="The trainer's exit code, if known."),
    dmesg: Path | None = typer.Option(None, help="Kernel log lines (dmesg) from the host."),
    running: bool = typer.Option(False, help="The trainer is still alive (default: it is gone)."),
    baseline_tokens_per_second: float | None = typer.Option(None, help="Known-good throughput."),
    seconds_since_log_write: float | None = typer.Option(
        None, help="With --running: how long ago the log last changed (default: its mtime)."
    ),
    pid: int | None = typer.Option(
        None, help="The trainer's PID (its run record's `pid`): the kernel's OOM kill of exactly it is the run's."
    ),
    started_at: str | None = typer.Option(
        None,
        help="When the run started: epoch seconds or ISO 8601 (UTC unless it says). Without --pid, an OOM kill before it "
        "is not the run's (compared where the kernel lines carry wall-clock times: dmesg --time-format iso).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print verdict, cause, package, evidence, metrics as JSON."),
) -> None:
    """Diagnose a saved log: what a person runs on the log of a run that died last night."""
    import time

    from relaunch.judging.diagnosis import diagnose as judge
    from relaunch.judging.logtext import read_log
    from relaunch.judging.snapshot import HealthSnapshot

    with errors(as_json):
        try:
            # Bounded reads: what the host's poll sends (earliest failures, the tail), whatever the log's size.
            excerpt = read_log(log)
            kernel = read_log(dmesg, max_matches=0).tail if dmesg else []
        except OSError as exc:
            raise ConfigError(f"cannot read {exc.filename}: {exc.strerror}") from None
    now = time.time()
    quiet = seconds_since_log_write if seconds_since_log_write is not None else max(0.0, now - excerpt.mtime)
    with errors(as_json):
        started = _epoch(started_at) if started_at is not None else None
    # The snapshot's clock: the run's start is the log's mtime plus the seconds since that write, less those since launch.
    since_launch = (excerpt.mtime + quiet - started) if started is not None else 1e9 if running else None
    snap = HealthSnapshot(
        host="(saved log)",
        launched=True,
        pid=pid,
        pid_alive=running,
        exit_code=None if running else exit_code,
        log_tail=excerpt.tail,
        log_matches=excerpt.matches,
        kernel_lines=kernel,
        seconds_since_launch=since_launch,
        seconds_since_log_write=quiet,
        log_mtime_epoch=excerpt.mtime if started is not None else None,
        log_size_bytes=excerpt.size_bytes,
    )
    thresholds = Thresholds(baseline_tokens_per_second=baseline_tokens_per_second)
    d = judge(snap, thresholds)
    if as_json:
        print_json(
            {
                "verdict": d.verdict.value,
                "cause": d.cause.value if d.cause else None,
                "package": d.package,
                "summary": d.summary,
                "evidence": d.evidence,
                "metrics": d.metrics.model_dump(),
            }
        )
    else:
        print(f"verdict: {d.verdict.value}" + (f" ({d.cause.value})" if d.cause else "") + f": {d.summary}")
        for line in d.evidence:
            print(f"  | {line}")
    raise typer.Exit(0 if d.verdict.is_fine() else 1)


def _epoch(text: str) -> float:
    """--started-at as epoch seconds: a number is one already; an ISO 8601 time without a zone is UTC."""
    from datetime import UTC, datetime

    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--started-at {text!r}: give epoch seconds or an ISO 8601 time (2026-12-02T21:59:14Z)") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


@app.command()
def check(
    target_file: Path = typer.Argument(..., help="Target YAML."),
    recover: bool = typer.Option(
        False, "--recover", help="Recover a crashed, stalled, degraded, diverged or never-launched run (the nightly check)."
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Check a target's health; signal, stop or start nothing unless --recover (a run started by hand is adopted: recorded, not touched)."""
    from relaunch.flows.check import check_training

    with errors(as_json):
        target = reach(load_target(target_file))
        report = run_flow(check_training, as_json, target=target, recover=recover)
        missing = _missing_repo(target, report)
    if missing:
        report.message = missing
    print_report(report, as_json)
    if missing:
        print(
            f"relaunch: {missing}\n  what to do: fix repo_dir in {target_file}, or put the training code's checkout there", file=sys.stderr
        )
        raise typer.Exit(2)
    exit_for(report)


def _missing_repo(target: Any, report: Any) -> str | None:
    """Nothing on record (`unknown`) where the check found repo_dir is not a folder on the host: a target file that
    names the wrong place, said as that (exit 2) rather than as a run to launch."""
    from relaunch.vocabulary import Verdict

    last = report.attempts[-1] if report.attempts else None
    if report.verdict is not Verdict.UNKNOWN or last is None or not last.repo_dir_missing:
        return None
    return f"repo_dir {last.repo_dir_missing} is not a folder on {target.host.label}: there is no training code to check or launch"


@app.command()
def recover(
    target_file: Path = typer.Argument(..., help="Target YAML."),
    force: bool = typer.Option(
        False,
        help="Run the full procedure (venv, code, cache, launch) whatever the check finds, even on a healthy run (asks first on a terminal).",
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the host commands of the full procedure; run nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before --force stops a healthy run."),
) -> None:
    """Recover a target: diagnose, act on the verdict through the playbook, check again."""
    if dry_run:
        from relaunch.cli.dryrun import render

        with errors():
            print(render(load_target(target_file)))
        raise typer.Exit(0)
    from relaunch.flows.recover import recover_training

    with errors(as_json):
        target = reach(load_target(target_file))
    if force:
        confirm(f"--force stops {target.name} on {target.host.label} even if it is healthy, and relaunches it. Go on?", yes)
    with errors(as_json):
        report = run_flow(recover_training, as_json, target=target, force=force)
    print_report(report, as_json)
    exit_for(report)


def _where(target: Any) -> str:
    from relaunch.deciding.gang import gang_label

    return gang_label(target)


@app.command()
def stop(
    target_file: Path = typer.Argument(..., help="Target YAML."),
    grace_seconds: float | None = typer.Option(
        None,
        "--grace-seconds",
        "--timeout-seconds",
        help="After its one SIGTERM, give the trainer this long to save and exit before SIGKILL (default: the target's stop_grace_seconds).",
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before stopping (it never asks when input is not a terminal)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was stopped (the host's output and exit code) as JSON."),
) -> None:
    """Stop what relaunch started or adopted (recorded PIDs, the run's marker, its own tmux pane), on purpose: checks
    leave the target stopped until `relaunch recover`. Waits for its GPU memory to be released."""
    with errors(as_json):
        target = reach(load_target(target_file))
    where = _where(target)
    confirm(f"Stop {target.name} on {where}? Checks leave it stopped until `relaunch recover`.", yes)
    with errors(as_json):
        result = stop_target(target, grace_seconds, deliberate=True)
    if as_json:
        print_json({"target": target.name, "host": where, "exit_code": result.exit_code, "output": result.stdout.strip()})
    else:
        print(result.stdout.strip() or "nothing to stop")
    if result.exit_code != 0:
        print(
            f"relaunch: the stop ({target.state_path}) on {where} exited {result.exit_code}: {result.tail}\n"
            "  what to do: look at the processes it names (ps -o pid,stat,wchan,cmd -p PID), end them by hand, and stop again",
            file=sys.stderr,
        )
        raise typer.Exit(1)


@app.command()
def adopt(
    target_file: Path = typer.Argument(..., help="Target YAML."),
    log: str | None = typer.Option(
        None, "--log", help="The file the run writes its log to, on the host (default: found from the pane's tee or standard output)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print what was recorded as JSON."),
) -> None:
    """Record a run started by hand in the target's tmux session as the current run; nothing is signalled.

    Later checks judge it by the same rules as relaunch's own runs; stops and recoveries treat it as theirs."""
    from relaunch.tasks.adopt import adopt_run

    with errors(as_json):
        adoption = adopt_run(reach(one_host(load_target(target_file), "adopt")), log)
    if as_json:
        print_json(adoption.model_dump(mode="json"))
    else:
        print(
            f"adopted pid {adoption.pid} ({adoption.command}) as run {adoption.run_id}; log {adoption.log_path} (found by {adoption.how})"
        )


@app.command()
def logs(
    target_file: Path = typer.Argument(..., help="Target YAML."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing what the trainer writes (Ctrl-C to stop)."),
    lines: int = typer.Option(100, "--lines", "-n", help="Lines of the end of the log to print first."),
) -> None:
    """Print the current attempt's log (over SSH too); -f follows it."""
    from relaunch.cli.logview import follow_log, log_path_of, tail_lines

    with errors():
        target = reach(one_host(load_target(target_file), "logs"))
        path = log_path_of(target)
        print(f"==> {path} on {target.host.label} <==", file=sys.stderr)
        offset = tail_lines(target, path, lines, sys.stdout)
        if follow:
            follow_log(target, path, offset, sys.stdout)


@app.command()
def fleet(
    fleet_file: Path = typer.Argument(
        ..., help="Fleet YAML: `targets:` (target files, relative to it, or inline targets), optional `max_concurrent:`."
    ),
    recover: bool = typer.Option(True, "--recover/--check-only", help="Recover the sick targets (default), or only check."),
    as_json: bool = typer.Option(False, "--json", help="Print the fleet's table (one row per target) as JSON."),
) -> None:
    """Check many targets at once; recover the sick ones, one recovery per host at a time."""
    from relaunch.cli.spinner import spinning
    from relaunch.config import load_fleet
    from relaunch.flows.fleet import check_fleet

    with errors(as_json):
        targets, max_concurrent = load_fleet(fleet_file)
        with spinning(check_fleet.name, as_json), untraced():
            state = check_fleet(targets=targets, recover=recover, max_concurrent=max_concurrent, return_state=True)
        result = state.result(raise_on_failure=False)
        if isinstance(result, BaseException):
            raise result
    if as_json:
        print_json(result.model_dump(mode="json"))
    else:
        for row in result.rows:
            print(
                f"{row.target:<24} {row.host:<32} {(row.verdict.value if row.verdict else 'error'):<10} {'recovered' if row.recovered else '':<9} {row.message}"
            )
            for n in row.nodes:  # a run of several nodes: a row per node under it
                print(f"  {n.line()}")
        print(result.summary())
    raise typer.Exit(0 if all(r.verdict is not None and r.verdict.is_fine() for r in result.rows) else 1)
