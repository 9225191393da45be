"""`relaunch`: demo, diagnose, check, recover."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from relaunch.config import Thresholds, load_target
from relaunch.errors import RelaunchError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Bring a dead or sick training run back to health, and say why it died.")


def _print_report(report, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report.model_dump(mode="json"), indent=2))
        return
    print("\n".join(report.timeline()))
    print(f"verdict: {report.verdict.value if report.verdict else 'none'}" + (f" ({report.cause.value})" if report.cause else "") + (f": {report.message}" if report.message else ""))


def _fail(exc: Exception) -> None:
    print(f"relaunch: {exc}", file=sys.stderr)
    raise typer.Exit(2)


@app.command()
def demo(
    scenario: str = typer.Option("healthy", help="healthy, missing-dependency, fx-race, silent-death, degraded"),
    workdir: Path = typer.Option(Path(".cache/demo"), help="Folder for the demo targets."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    keep_running: bool = typer.Option(False, help="Leave the recovered trainer running in tmux."),
) -> None:
    """Build the demo target, break it as the scenario says, recover it with Prefect's embedded default."""
    from demo.scenarios import SCENARIOS, prepare

    if scenario not in SCENARIOS:
        _fail(ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}"))
    from flows.recover import recover_training

    target = prepare(scenario, workdir.resolve() / scenario)
    try:
        report = recover_training(target)
    finally:
        if not keep_running:
            from relaunch.transport import run, transport_for
            from tasks.stop import plan_stop

            run(transport_for(target.host), plan_stop(target, 20), check=False)
    _print_report(report, as_json)
    if not as_json:
        print(f"logs: {target.log_dir}   patches and run records: {target.state_path}")
        print("the recovered trainer was stopped at the end; --keep-running leaves it in tmux" if not keep_running else f"the trainer runs on: tmux attach -t {target.tmux_session}")
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def diagnose(
    log: Path = typer.Argument(..., help="A saved trainer log."),
    exit_code: Optional[int] = typer.Option(None, help="The trainer's exit code, if known."),
    dmesg: Optional[Path] = typer.Option(None, help="Kernel log lines (dmesg) from the host."),
    running: bool = typer.Option(False, help="The trainer is still alive (default: it is gone)."),
    baseline_tokens_per_second: Optional[float] = typer.Option(None, help="Known-good throughput."),
    seconds_since_log_write: Optional[float] = typer.Option(None, help="With --running: how long ago the log last changed (default: its mtime)."),
    as_json: bool = typer.Option(False, "--json", help="Print verdict, cause, package, evidence, metrics as JSON."),
) -> None:
    """Diagnose a saved log: what a person runs on the log of a run that died last night."""
    import time

    from relaunch.diagnosis import diagnose as judge
    from relaunch.logtext import read_log
    from relaunch.snapshot import HealthSnapshot

    try:
        # Bounded reads: what the host's poll sends (earliest failures, the tail), whatever the log's size.
        excerpt = read_log(log)
        kernel = read_log(dmesg, max_matches=0).tail if dmesg else []
    except RelaunchError as exc:
        _fail(exc)
    except OSError as exc:
        _fail(RelaunchError(f"cannot read {exc.filename}: {exc.strerror}"))
    quiet = seconds_since_log_write if seconds_since_log_write is not None else max(0.0, time.time() - excerpt.mtime)
    snap = HealthSnapshot(host="(saved log)", launched=True, pid_alive=running, exit_code=None if running else exit_code, log_tail=excerpt.tail, log_matches=excerpt.matches, kernel_lines=kernel, seconds_since_launch=1e9 if running else None, seconds_since_log_write=quiet, log_size_bytes=excerpt.size_bytes)
    thresholds = Thresholds(baseline_tokens_per_second=baseline_tokens_per_second)
    d = judge(snap, thresholds)
    if as_json:
        print(json.dumps({"verdict": d.verdict.value, "cause": d.cause.value if d.cause else None, "package": d.package, "summary": d.summary, "evidence": d.evidence, "metrics": d.metrics.model_dump()}, indent=2))
        return
    print(f"verdict: {d.verdict.value}" + (f" ({d.cause.value})" if d.cause else "") + f": {d.summary}")
    for line in d.evidence:
        print(f"  | {line}")


@app.command()
def check(target_file: Path = typer.Argument(..., help="Target YAML."), as_json: bool = typer.Option(False, "--json")) -> None:
    """Check a target's health; change nothing."""
    from flows.check import check_training

    try:
        report = check_training(load_target(target_file))
    except RelaunchError as exc:
        _fail(exc)
    _print_report(report, as_json)
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def recover(target_file: Path = typer.Argument(..., help="Target YAML."), force: bool = typer.Option(False, help="Run the full procedure even on a healthy run."), as_json: bool = typer.Option(False, "--json")) -> None:
    """Recover a target: diagnose, act on the verdict through the playbook, check again."""
    from flows.recover import recover_training

    try:
        report = recover_training(load_target(target_file), force=force)
    except RelaunchError as exc:
        _fail(exc)
    _print_report(report, as_json)
    raise typer.Exit(0 if report.ok else 1)


@app.command("rollback-venv")
def rollback_venv_command(target_file: Path = typer.Argument(..., help="Target YAML.")) -> None:
    """Put the previous venv back (the newest VENV.old-*); the current one is kept as VENV.rolled-back-*."""
    from tasks.rollback_venv import rollback_venv

    try:
        step = rollback_venv.fn(load_target(target_file))
    except RelaunchError as exc:
        _fail(exc)
    print(f"restored {step.detail['restored_from']}; the replaced venv is kept as {step.detail['rolled_back_to']}")


def main() -> None:
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    app()


if __name__ == "__main__":
    main()
