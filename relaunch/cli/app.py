"""`relaunch`: demo, diagnose, check, recover, stop, adopt, logs, fleet, rollback-venv, doctor, agent, gpus."""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer

from relaunch.config import Thresholds, load_target
from relaunch.errors import ConfigError, HostUnreachable, PreflightFailed, RelaunchError
from relaunch.tasks import secrets

# Keys and passphrases in Secret blocks are read through Prefect (imported only when a host needs one).
secrets.install()

EXIT_CODES = (
    "Exit codes: 0 healthy, starting or finished; 1 not healthy (escalated, out of attempts, a step failed, "
    "another recovery holds the target); 2 bad input (the target file, a preflight problem, a host that cannot be "
    "reached: nothing ran there); "
    "3 an unexpected error (run again with --debug for the traceback)."
)

app = typer.Typer(
    # `relaunch --install-completion` (bash, zsh, fish): commands, options and the choices below complete.
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Bring a dead or sick training run back to health, and say why it died.\n\n" + EXIT_CODES,
)
DEBUG = {"on": False}
JSON_HELP = "Print the report (verdict, cause, attempts, steps, message) as JSON."


class Scenario(str, Enum):
    """The demo's scenarios (relaunch.demo.scenarios.SCENARIOS; tests/test_cli_options.py keeps them the same)."""

    HEALTHY = "healthy"
    MISSING_DEPENDENCY = "missing-dependency"
    FX_RACE = "fx-race"
    SILENT_DEATH = "silent-death"
    DEGRADED = "degraded"
    DIVERGED = "diverged"
    BROKEN_CHECKPOINT = "broken-checkpoint"
    CORRUPT_CACHE = "corrupt-cache"
    MULTI_NODE = "multi-node"


class Device(str, Enum):
    CUDA = "cuda"
    CPU = "cpu"


def _confirm(question: str, yes: bool) -> None:
    """Ask on a terminal before something destructive; --yes, or input that is not a terminal (a script, a pipe), skips it."""
    if yes or not sys.stdin.isatty():
        return
    if not typer.confirm(question, default=False):
        print("relaunch: nothing done", file=sys.stderr)
        raise typer.Exit(1)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"relaunch {version('relaunch')}")
        raise typer.Exit(0)


@app.callback()
def _options(
    debug: bool = typer.Option(False, "--debug", help="Show the full traceback of an unexpected error."),
    _: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    DEBUG["on"] = debug


class NotReached(RelaunchError):
    """The target's host could not be reached before the command did anything there (`_reach`): exit 2."""

    def __init__(self, error: RelaunchError) -> None:
        self.error = error
        super().__init__(str(error))


def exit_code_of(exc: BaseException) -> int:
    """The exit code of one of relaunch's errors: 2 bad input (the target file, a preflight problem, a host that could
    not be reached before anything ran there), 1 every other refusal or failure."""
    if isinstance(exc, (ConfigError, PreflightFailed, NotReached)):
        return 2
    if isinstance(exc, HostUnreachable) and exc.first_contact:
        return 2
    return 1


def error_json(exc: BaseException, code: int, message: str | None = None) -> dict[str, Any]:
    """The JSON object `--json` prints for a failure: the same facts as the one line, in fields."""
    import re

    from relaunch.plans.doctor import split_advice

    inner = exc.error if isinstance(exc, NotReached) else exc
    what, advice = split_advice(inner) if message is None else (message, "")
    kind = re.sub(r"(?<!^)(?=[A-Z])", "_", type(inner).__name__).lower()
    found: dict[str, Any] = {"ok": False, "exit_code": code, "error": kind, "message": what, "what_to_do": advice or None}
    if isinstance(getattr(inner, "host", None), str):
        found["host"] = inner.host
    return found


@contextmanager
def _errors(as_json: bool = False) -> Iterator[None]:
    """One clean line for every failure: what failed and what to do; the traceback only with --debug. With --json,
    the same as a JSON object on stdout too (`error_json`), so a program reading it gets an answer for every outcome."""

    def fail(exc: BaseException, code: int, line: str, message: str | None = None) -> typer.Exit:
        print(line, file=sys.stderr)
        if as_json:
            print(json.dumps(error_json(exc, code, message), indent=2))
        return typer.Exit(code)

    try:
        yield
    except typer.Exit:
        raise
    except RelaunchError as exc:
        raise fail(exc, exit_code_of(exc), f"relaunch: {exc}") from None
    except KeyboardInterrupt as exc:
        raise fail(exc, 130, "relaunch: interrupted", "interrupted") from None
    except BrokenPipeError:
        # `relaunch logs -f | head`: the reader left; no error, and no second one at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected error becomes a line and exit 3
        if DEBUG["on"]:
            traceback.print_exc()
        last = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        advice = "run again with --debug for the traceback, and report it if it looks like a bug"
        raise fail(exc, 3, f"relaunch: unexpected error: {last}\n  what to do: {advice}", f"unexpected error: {last}") from None


def _reach(target: Any) -> Any:
    """Before a command does anything on the target's host: open the SSH route to it, the connection its commands then
    use (relaunch.transport's pool). A host that cannot be reached (refused, no answer, no such name, a host key or
    key refused) ends the command here, at once: one line, exit 2, no flow run, nothing ran there. A gang is left to
    its flows, which put a spare in place of a node that cannot be reached."""
    if target.nodes or target.host.kind != "ssh":
        return target
    from relaunch.ssh import SSHTransport
    from relaunch.transport import transport_for

    transport = transport_for(target.host)
    if isinstance(transport, SSHTransport):
        failed = transport.reach()[-1][1]
        if failed is not None:
            raise NotReached(failed)
    return target


def _print_report(report: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report.model_dump(mode="json"), indent=2))
        return
    print("\n".join(report.timeline()))
    print(
        f"verdict: {report.verdict.value if report.verdict else 'none'}"
        + (f" ({report.cause.value})" if report.cause else "")
        + (f": {report.message}" if report.message else "")
    )


def _exit_for(report: Any) -> None:
    raise typer.Exit(0 if report.verdict is not None and report.verdict.is_fine() else 1)


def _run_flow(flow: Callable[..., Any], as_json: bool, **parameters: Any) -> Any:
    """The flow's report whether the run Completed or Failed; a step's own error is raised as itself.
    On a terminal (not --json) a spinner shows the step in progress and the run's link meanwhile."""
    from prefect import tags

    from relaunch.cli.spinner import spinning
    from relaunch.flows.outcome import report_of, run_tags

    # The run is created with its target and host tags, so the flow's own tagging has nothing left to send.
    with tags(*run_tags(parameters["target"])), spinning(flow.name, as_json), untraced():
        return report_of(flow(**parameters, return_state=True))


class _Untraced:
    """A log formatter that leaves out the traceback of one of relaunch's own errors (it ends the command as one line
    that says what to do); any other record, an unexpected error's traceback too, is formatted as before."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def format(self, record: Any) -> str:
        if not (record.exc_info and isinstance(record.exc_info[1], RelaunchError)):
            return self.inner.format(record)
        saved = record.exc_info, record.exc_text
        record.exc_info = record.exc_text = None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text = saved

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextmanager
def untraced() -> Iterator[None]:
    """While a flow runs: the lines Prefect prints on this terminal (stdout, stderr) for a task or flow that raised one
    of relaunch's errors carry no traceback (with --debug they do). The run's logs in the UI keep it (another handler)."""
    import logging

    from relaunch.cli.spinner import stream_handlers

    if DEBUG["on"]:
        yield
        return
    handlers = [h for h, _ in stream_handlers((1, 2)) if not isinstance(h.formatter, _Untraced)]
    for h in handlers:
        h.setFormatter(_Untraced(h.formatter or logging.Formatter()))  # type: ignore[arg-type]
    try:
        yield
    finally:
        for h in handlers:
            if isinstance(h.formatter, _Untraced):
                h.setFormatter(h.formatter.inner)


@app.command()
def demo(
    scenario: Scenario = typer.Option(Scenario.HEALTHY, help="The fault to break the demo trainer with (docs/demo.md)."),
    workdir: Path = typer.Option(Path(".cache/demo"), help="Folder for the demo targets."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    keep_running: bool = typer.Option(False, help="Leave the recovered trainer running in tmux."),
    device: Optional[Device] = typer.Option(
        None,
        help="cuda: the trainer on the GPUs, compiled flex_attention, torch from this interpreter; cpu. Default: cuda where torch sees a GPU.",
    ),
) -> None:
    """Build the demo target, break it as the scenario says, recover it with Prefect's embedded default."""
    from relaunch.demo.scenarios import SCENARIOS, prepare
    from relaunch.demo.target import resolve_device

    scenario = Scenario(scenario).value
    if scenario not in SCENARIOS:
        print(f"relaunch: unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}", file=sys.stderr)
        raise typer.Exit(2)
    from relaunch.flows.recover import recover_training

    if SCENARIOS[scenario].nodes > 1:
        from relaunch.demo.multinode import broken_gang

        # Its hosts are namespaces that go with it: the gang is stopped and they are removed on exit (and on Ctrl-C).
        with _errors(as_json), broken_gang(workdir.resolve() / scenario) as target:
            report = _run_flow(recover_training, as_json, target=target)
        _print_report(report, as_json)
        _exit_for(report)
        return
    with _errors(as_json):
        target = prepare(scenario, workdir.resolve() / scenario, device=resolve_device(device.value if device else None))
        target_file = _write_target(target, workdir.resolve() / scenario / "target.yaml")
        try:
            report = _run_flow(recover_training, as_json, target=target)
        finally:
            if not keep_running:
                # Recorded as a person's stop: the `relaunch check` the demo suggests next says `stopped`, not crashed.
                _stop(target, deliberate=True)
    _print_report(report, as_json)
    if not as_json:
        print(f"logs: {target.log_dir}   patches and run records: {target.state_path}")
        print(
            "the recovered trainer was stopped at the end; --keep-running leaves it in tmux"
            if not keep_running
            else f"the trainer runs on: tmux attach -t {target.tmux_session}"
        )
        exe = Path(sys.argv[0]).resolve() if Path(sys.argv[0]).name == "relaunch" else "relaunch"
        print(
            f"the demo's target file: {target_file}; try:\n  {exe} check {target_file}\n  {exe} logs {target_file}\n  {exe} stop {target_file}"
        )
    _exit_for(report)


def _write_target(target: Any, path: Path) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(target.model_dump(mode="json", exclude_defaults=True), sort_keys=False))
    return path


def one_host(target: Any, command: str) -> Any:
    """The commands that take one host refuse a gang (exit 2) rather than act on its unused `host`."""
    if target.nodes:
        raise ConfigError(
            f"{target.name} runs on {len(target.nodes)} nodes: `relaunch {command}` takes one host; check, recover, stop and "
            "fleet take the gang (docs/multinode.md)"
        )
    return target


def _where(target: Any) -> str:
    from relaunch.gang import gang_label

    return gang_label(target)


def _stop(target: Any, grace_seconds: float | None = None, deliberate: bool = False) -> Any:
    """The stop on the target's host; on a gang, on every node (all at once), one result saying each node's output and
    the first failing exit code."""
    from concurrent.futures import ThreadPoolExecutor

    from relaunch.commands import Result
    from relaunch.gang import indexed
    from relaunch.plans.stop import plan_stop
    from relaunch.transport import run, transport_for

    def one(node: Any) -> Result:
        return run(transport_for(node.host), plan_stop(node, grace_seconds, deliberate=deliberate), check=False)

    nodes = indexed(target)
    if nodes[0][0] is None:
        return one(target)
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        results = list(pool.map(one, [node for _, node in nodes]))
    return Result(
        exit_code=next((r.exit_code for r in results if r.exit_code != 0), 0),
        stdout="\n".join(f"node {k} ({node.host.label}): {r.stdout.strip()}" for (k, node), r in zip(nodes, results, strict=True)),
        stderr="\n".join(r.stderr for r in results if r.stderr),
    )


@app.command()
def diagnose(
    log: Path = typer.Argument(..., help="A saved trainer log."),
    exit_code: Optional[int] = typer.Option(None, help="The trainer's exit code, if known."),
    dmesg: Optional[Path] = typer.Option(None, help="Kernel log lines (dmesg) from the host."),
    running: bool = typer.Option(False, help="The trainer is still alive (default: it is gone)."),
    baseline_tokens_per_second: Optional[float] = typer.Option(None, help="Known-good throughput."),
    seconds_since_log_write: Optional[float] = typer.Option(
        None, help="With --running: how long ago the log last changed (default: its mtime)."
    ),
    pid: Optional[int] = typer.Option(
        None, help="The trainer's PID (its run record's `pid`): the kernel's OOM kill of exactly it is the run's."
    ),
    started_at: Optional[str] = typer.Option(
        None,
        help="When the run started: epoch seconds or ISO 8601 (UTC unless it says). Without --pid, an OOM kill before it "
        "is not the run's (compared where the kernel lines carry wall-clock times: dmesg --time-format iso).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print verdict, cause, package, evidence, metrics as JSON."),
) -> None:
    """Diagnose a saved log: what a person runs on the log of a run that died last night."""
    import time

    from relaunch.diagnosis import diagnose as judge
    from relaunch.logtext import read_log
    from relaunch.snapshot import HealthSnapshot

    with _errors(as_json):
        try:
            # Bounded reads: what the host's poll sends (earliest failures, the tail), whatever the log's size.
            excerpt = read_log(log)
            kernel = read_log(dmesg, max_matches=0).tail if dmesg else []
        except OSError as exc:
            raise ConfigError(f"cannot read {exc.filename}: {exc.strerror}") from None
    now = time.time()
    quiet = seconds_since_log_write if seconds_since_log_write is not None else max(0.0, now - excerpt.mtime)
    with _errors(as_json):
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
        print(
            json.dumps(
                {
                    "verdict": d.verdict.value,
                    "cause": d.cause.value if d.cause else None,
                    "package": d.package,
                    "summary": d.summary,
                    "evidence": d.evidence,
                    "metrics": d.metrics.model_dump(),
                },
                indent=2,
            )
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

    with _errors(as_json):
        target = _reach(load_target(target_file))
        report = _run_flow(check_training, as_json, target=target, recover=recover)
        missing = _missing_repo(target, report)
    if missing:
        report.message = missing
    _print_report(report, as_json)
    if missing:
        print(
            f"relaunch: {missing}\n  what to do: fix repo_dir in {target_file}, or put the training code's checkout there", file=sys.stderr
        )
        raise typer.Exit(2)
    _exit_for(report)


def _missing_repo(target: Any, report: Any) -> str | None:
    """Nothing on record (`unknown`) where repo_dir is not a folder on the host: a target file that names the wrong
    place, said as that (exit 2) rather than as a run to launch. One `test -d` on the host, only then."""
    from relaunch.commands import Command
    from relaunch.transport import run, transport_for
    from relaunch.vocabulary import Verdict

    if target.nodes or report.verdict is not Verdict.UNKNOWN:
        return None
    probe = Command(argv=("test", "-d", target.repo_dir), timeout_seconds=30, label="is repo_dir a folder")
    if run(transport_for(target.host), probe, check=False).exit_code == 0:
        return None
    return f"repo_dir {target.repo_dir} is not a folder on {target.host.label}: there is no training code to check or launch"


@app.command()
def recover(
    target_file: Path = typer.Argument(..., help="Target YAML."),
    force: bool = typer.Option(False, help="Run the full procedure even on a healthy run (asks first on a terminal)."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the host commands of the full procedure; run nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before --force stops a healthy run."),
) -> None:
    """Recover a target: diagnose, act on the verdict through the playbook, check again."""
    if dry_run:
        from relaunch.cli.dryrun import render

        with _errors():
            print(render(load_target(target_file)))
        raise typer.Exit(0)
    from relaunch.flows.recover import recover_training

    with _errors(as_json):
        target = _reach(load_target(target_file))
    if force:
        _confirm(f"--force stops {target.name} on {target.host.label} even if it is healthy, and relaunches it. Go on?", yes)
    with _errors(as_json):
        report = _run_flow(recover_training, as_json, target=target, force=force)
    _print_report(report, as_json)
    _exit_for(report)


@app.command()
def stop(
    target_file: Path = typer.Argument(..., help="Target YAML."),
    grace_seconds: Optional[float] = typer.Option(
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
    with _errors(as_json):
        target = _reach(load_target(target_file))
    where = _where(target)
    _confirm(f"Stop {target.name} on {where}? Checks leave it stopped until `relaunch recover`.", yes)
    with _errors(as_json):
        result = _stop(target, grace_seconds, deliberate=True)
    if as_json:
        print(json.dumps({"target": target.name, "host": where, "exit_code": result.exit_code, "output": result.stdout.strip()}, indent=2))
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
    log: Optional[str] = typer.Option(
        None, "--log", help="The file the run writes its log to, on the host (default: found from the pane's tee or standard output)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print what was recorded as JSON."),
) -> None:
    """Record a run started by hand in the target's tmux session as the current run; nothing is signalled.

    Later checks judge it by the same rules as relaunch's own runs; stops and recoveries treat it as theirs."""
    from relaunch.tasks.adopt import adopt_run

    with _errors(as_json):
        adoption = adopt_run(_reach(one_host(load_target(target_file), "adopt")), log)
    if as_json:
        print(json.dumps(adoption.model_dump(mode="json"), indent=2))
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

    with _errors():
        target = _reach(one_host(load_target(target_file), "logs"))
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

    with _errors(as_json):
        targets, max_concurrent = load_fleet(fleet_file)
        with spinning(check_fleet.name, as_json), untraced():
            state = check_fleet(targets=targets, recover=recover, max_concurrent=max_concurrent, return_state=True)
        result = state.result(raise_on_failure=False)
        if isinstance(result, BaseException):
            raise result
    if as_json:
        print(json.dumps(result.model_dump(mode="json"), indent=2))
    else:
        for row in result.rows:
            print(
                f"{row.target:<24} {row.host:<32} {(row.verdict.value if row.verdict else 'error'):<10} {'recovered' if row.recovered else '':<9} {row.message}"
            )
            for n in row.nodes:  # a run of several nodes: a row per node under it
                print(f"  {n.line()}")
        print(result.summary())
    raise typer.Exit(0 if all(r.verdict is not None and r.verdict.is_fine() for r in result.rows) else 1)


@app.command("deploy")
def deploy_command(
    target_file: Path = typer.Argument(..., help="Target YAML, or a target's name in ~/.config/relaunch/targets."),
    cron: str = typer.Option("0 3 * * *", "--cron", help="When the nightly check runs (cron, in --timezone)."),
    timezone: str = typer.Option("UTC", "--timezone", help="The time zone the cron schedule is read in (IANA name, e.g. Europe/Berlin)."),
    pool: str = typer.Option("relaunch", "--pool", help="The work pool both deployments run on (a process pool is created when missing)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was deployed as JSON."),
) -> None:
    """Create or update the target's nightly check (`check-training/nightly-NAME`) and its recovery on demand
    (`recover-training/NAME`) from the installed package, the host's concurrency limit and the automations that tell a
    person. Run it again after editing the target file: nothing is duplicated, a paused schedule stays paused."""
    from relaunch.cli.deploy import deploy
    from relaunch.config import target_file as resolve

    with _errors(as_json):
        path = resolve(target_file).resolve()
        done = deploy(load_target(path), path, cron, timezone, pool, say=(lambda line: None) if as_json else print)
    if as_json:
        print(json.dumps(done.model_dump(mode="json"), indent=2))
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

    with _errors(as_json):
        name = load_target(target).name if Path(target).suffix in (".yaml", ".yml") or "/" in target else target
        removed = undeploy(name, say=(lambda line: None) if as_json else print)
    if as_json:
        print(json.dumps({"target": name, "deleted": removed}, indent=2))


@app.command("status")
def status_command(
    fleet_file: Optional[Path] = typer.Argument(
        None,
        help="A target YAML (or a target's name in ~/.config/relaunch/targets), or a fleet YAML (as for `relaunch fleet`); "
        "default: every target in ~/.config/relaunch/targets.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
) -> None:
    """One line per target from the Prefect server's records: verdict and since when, the last recovery, last
    night's goodput where a flow publishes it, the nightly schedule. Changes nothing, reaches no host."""
    from datetime import UTC, datetime

    from relaunch.cli.deploy import require_api
    from relaunch.cli.status import gather, render
    from relaunch.config import load_targets, target_names, targets_folder

    with _errors(as_json):
        if fleet_file is not None:
            targets = load_targets(fleet_file)
        else:
            targets = [load_target(name) for name in target_names()]
            if not targets:
                raise ConfigError(f"no targets in {targets_folder()}: save target files there as NAME.yaml, or give a fleet file")
        require_api()
        rows = gather(targets)
    if as_json:
        print(json.dumps([r.model_dump(mode="json") for r in rows], indent=2))
    else:
        print(render(rows, datetime.now(UTC)))


@app.command("services")
def services_command(
    systemd: Optional[Path] = typer.Option(
        None, "--systemd", help="Write prefect-server.service and relaunch-worker.service into this folder."
    ),
    compose: Optional[Path] = typer.Option(
        None,
        "--compose",
        help="Write compose.yaml (PostgreSQL, Redis, server, worker) and .env (random secrets, if none) into this folder.",
    ),
    user: str = typer.Option("prefect", "--user", help="The system user the units run as (create it: useradd --system prefect)."),
    host: str = typer.Option("127.0.0.1", "--host", help="The address the server listens on."),
    port: int = typer.Option(4200, "--port", help="The port the server listens on."),
    pool: str = typer.Option("relaunch", "--pool", help="The work pool the worker polls."),
    api_url: Optional[str] = typer.Option(None, "--api-url", help="The API the worker unit talks to (default: the server unit's)."),
) -> None:
    """Write the control plane as services: systemd units for a Prefect server and a relaunch worker, and a compose
    file for the scale-out set-up (docs/operations.md). They run the relaunch installed here."""
    from relaunch.cli.services import values, write_compose, write_systemd

    if systemd is None and compose is None:
        print("relaunch: give --systemd DIR, --compose DIR, or both", file=sys.stderr)
        raise typer.Exit(2)
    with _errors():
        filled = values(user, host, port, pool, api_url)
        written = (write_systemd(systemd, filled) if systemd else []) + (write_compose(compose, filled) if compose else [])
    for path in written:
        print(f"wrote {path}")


# ---- goodput: where a target's time went (relaunch/goodput.py; docs/goodput.md) ----------------------------------
@app.command()
def goodput(
    target: str = typer.Argument(..., help="Target YAML, or the target's name as its runs recorded it."),
    days: float = typer.Option(7.0, "--days", min=0.01, help="How many days back from now."),
    as_json: bool = typer.Option(False, "--json", help="Seconds per category, per UTC night and in total, and the segments."),
) -> None:
    """Productive training time and lost time by category, per night and in total, from what relaunch recorded in Prefect."""
    from datetime import UTC, datetime, timedelta

    from relaunch import goodput as gp
    from relaunch.tasks.goodput import collect_timeline

    with _errors(as_json):
        name = load_target(Path(target)).name if target.endswith((".yaml", ".yml")) or Path(target).is_file() else target
        now = datetime.now(UTC)
        result = gp.report(collect_timeline.fn(name, now - timedelta(days=days), now), days, now)
    print(json.dumps(result.model_dump(mode="json"), indent=2) if as_json else gp.text_table(result))
    raise typer.Exit(0)


@app.command("rollback-venv")
def rollback_venv_command(target_file: Path = typer.Argument(..., help="Target YAML.")) -> None:
    """Put the previous venv back (the newest VENV.old-*); the current one is kept as VENV.rolled-back-*."""
    from relaunch.tasks.rollback_venv import rollback_venv

    with _errors():
        step = rollback_venv.fn(_reach(one_host(load_target(target_file), "rollback-venv")))
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

    with _errors(as_json):
        target = one_host(load_target(target_file), "doctor")
        checks = examine(target, configured_api_url())
    if as_json:
        print(
            json.dumps(
                {
                    "target": target.name,
                    "host": target.host.label,
                    "passed": passed(checks),
                    "checks": [c.model_dump(mode="json") for c in checks],
                },
                indent=2,
            )
        )
    else:
        print(render(target, checks))
    raise typer.Exit(0 if passed(checks) else 1)


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
    _say_or_exit_1(lambda agent: agent.start(idle_minutes * 60))


@agent_app.command("stop")
def agent_stop() -> None:
    """Stop your agents (each finishes the commands it runs first)."""
    _say_or_exit_1(lambda agent: agent.stop())


def _say_or_exit_1(call: Callable[[Any], str]) -> None:
    """Print what relaunch.cli.agent's CALL says; its AgentError is one line on stderr and exit 1."""
    from relaunch.cli import agent

    try:
        print(call(agent))
    except agent.AgentError as exc:
        print(f"relaunch: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None


@agent_app.command("status")
def agent_status() -> None:
    """Say which agents run; exit 0 when one serves the code as it is now, 1 otherwise."""
    from relaunch.cli import agent

    text, current = agent.status()
    print(text)
    raise typer.Exit(0 if current else 1)


# ---- relaunch gpus: the GPU ledger (relaunch/ledger.py, kept in Prefect Variables by relaunch/tasks/memory.py) ----
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

    with _errors(as_json):
        with get_client(sync_client=True) as client:
            rows = [row for ledger in all_ledgers(client) for row in ledger.rows()]
    if as_json:
        print(json.dumps(rows, indent=2))
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

    with _errors():
        with get_client(sync_client=True) as client:
            ledger, removed = read_ledger(client, host).without(bus_id)
            if removed is not None:
                write_ledger(client, ledger)
    if removed is None:
        print(f"relaunch: no GPU at {bus_id} in the ledger of {host} (`relaunch gpus` lists it)", file=sys.stderr)
        raise typer.Exit(1)
    print(f"cleared {removed.name()} on {host}: relaunches may use it again")


def prepare_environment() -> None:
    """relaunch's defaults for Prefect, set before Prefect reads its settings (in this process or an agent's child)."""
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # relaunch's own log lines (SSH connects, reconnects, host-key notes) go to the flow run's logs in the UI.
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "relaunch")
    from relaunch.cli.tempserver import api_client_defaults

    # A per-request timeout shorter than Prefect's 60 s, unless the user set one (relaunch/cli/tempserver.py, "Bounded waits").
    api_client_defaults()


def main() -> None:
    prepare_environment()
    from relaunch.cli.tempserver import runs_flow, start_for_cli

    _reach_before_the_server(sys.argv[1:])
    # Before anything imports Prefect, and from the main thread: Prefect's own temporary server outlives a killed CLI.
    server = start_for_cli(sys.argv[1:])
    if runs_flow(sys.argv[1:]):
        _import_flows()
        if server is None:
            _exit_if_api_unanswered()
    _run_app()


def _reach_before_the_server(argv: list[str]) -> None:
    """`check` and `recover`: the host is reached (`_reach`) before the temporary Prefect server starts and the flows
    are imported, seconds of CPU a host that cannot be reached does not need: it is said, exit 2, in well under a
    second. The connection stays in the pool for the flow. Left to the command as before: a bad target file, a key or
    passphrase in a Secret block or a ~/.ssh/config alias (they may need the Prefect API), anything unusual in ARGV."""
    from relaunch.cli.tempserver import command_of

    command = command_of(argv)
    if command not in ("check", "recover") or "--help" in argv or "--dry-run" in argv:
        return
    rest = argv[argv.index(command) + 1 :]
    files = [arg for arg in rest if not arg.startswith("-")]
    if len(files) != 1:
        return
    try:
        target = load_target(files[0])
    except RelaunchError:
        return
    logins = [target.host, *target.host.jump]
    if target.host.ssh_config or any(h.key_secret_block or h.passphrase_secret_block for h in logins):
        return
    try:
        with _errors("--json" in rest):
            _reach(target)
    except typer.Exit as exc:
        _exit_now(exc.exit_code)


def _exit_if_api_unanswered() -> None:
    """Before any flow runs (so before any host action): a configured API that never answers ends the command, exit 3."""
    from relaunch.cli.tempserver import unanswered_api

    problem = unanswered_api()
    if problem:
        print(problem, file=sys.stderr)
        _exit_now(3)


def run_forked(argv: list[str]) -> None:
    """The command ARGV in an agent's child (relaunch/cli/agent.py), whose environment is now the caller's.

    Prefect was imported by the agent, with the agent's settings: they are read again from this environment
    (and its working folder's files), and its logging set up again onto this process's streams.
    """
    from prefect.context import refresh_global_settings_context
    from prefect.settings import get_current_settings

    from relaunch.cli.tempserver import runs_flow, start_for_cli

    sys.argv = argv
    prepare_environment()
    server = start_for_cli(argv[1:])
    agents = get_current_settings().logging
    refresh_global_settings_context()
    _logging_onto_these_streams(same_settings=get_current_settings().logging == agents)
    if server is None and runs_flow(argv[1:]):
        _exit_if_api_unanswered()
    _run_app()


def _logging_onto_these_streams(same_settings: bool) -> None:
    """Prefect's log handlers write to this process's stderr; set up again only when the settings differ
    (setup_logging parses its YAML and rebuilds every handler: 0.1 s)."""
    import logging

    from prefect.logging.configuration import setup_logging
    from prefect.settings import PREFECT_LOGGING_EXTRA_LOGGERS

    from relaunch.cli.spinner import stream_handlers

    if same_settings:
        streams = {1: sys.stdout, 2: sys.stderr}
        for handler, fd in stream_handlers((1, 2)):  # a file's descriptor is never 1 or 2 here
            handler.setStream(streams[fd])
        return
    # setup_logging adds the extra loggers' handlers again; the agent's go first.
    for name in PREFECT_LOGGING_EXTRA_LOGGERS.value():
        logging.getLogger(name).handlers.clear()
    setup_logging(incremental=False)


def import_all_flows() -> None:
    """What any command may need, for an agent to import once: every flow, and SSH (fabric, paramiko)."""
    import importlib

    for module in (
        "relaunch.flows.check",
        "relaunch.flows.recover",
        "relaunch.flows.fleet",
        "fastapi.encoders",
        "relaunch.ssh",
        "relaunch.demo.scenarios",
    ):
        importlib.import_module(module)


def _run_app() -> None:
    try:
        app()
    except SystemExit as exc:
        _exit_now(exc.code)


# What each flow command imports; loaded by `_import_flows` before the command runs.
FLOW_MODULES = {
    "check": ("relaunch.flows.check",),
    "recover": ("relaunch.flows.recover",),
    "demo": ("relaunch.flows.recover",),
    "fleet": ("relaunch.flows.fleet",),
}


def _import_flows() -> None:
    """Import the flow modules (Prefect: ~1,200 modules, 1-2 s) with the garbage collector off, then freeze them.

    What an import allocates lives until exit, so the collections those allocations trigger free nothing
    (measured: 0.2 s of CPU); frozen, later collections during the flow skip it too. A failed import is
    left to the command, which reports it as before.
    """
    import gc
    import importlib

    from relaunch.cli.tempserver import command_of

    gc.disable()
    try:
        # fastapi.encoders: Prefect imports it to serialise the flow's parameters when the flow is called.
        for module in (*FLOW_MODULES.get(command_of(sys.argv[1:]) or "", ()), "fastapi.encoders"):
            importlib.import_module(module)
    except Exception:  # noqa: BLE001 - the command's own import raises it again, inside its error handling
        pass
    finally:
        gc.freeze()
        gc.enable()


def _exit_now(code: object) -> None:
    """Exit without tearing the interpreter down: atexit hooks run, output is flushed, then os._exit.

    Prefect's exit hooks (flushing logs and events to the API) and the temporary server's stop are atexit
    hooks, and every thread left is a daemon; what is skipped is freeing ~1,200 modules one object at a
    time (measured: 0.4-0.6 s of CPU per run).
    """
    import atexit

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed pipe or stream: nothing more can reach it
    os._exit(status)


if __name__ == "__main__":
    main()
