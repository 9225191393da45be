"""The one `relaunch` Typer app and what its commands share: the global options (--debug, --version), the exit codes,
one clean line (and with --json one JSON object) for every failure, reaching a target's host before anything runs
there, a flow run on the terminal and its report, the stop on every node. Each command group registers its commands
on `app`; relaunch/cli/app.py imports them all."""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer

from relaunch.errors import ConfigError, HostUnreachable, PreflightFailed, RelaunchError

EXIT_CODES = (
    "Exit codes: 0 healthy, starting or finished; 1 not healthy (escalated, out of attempts, a step failed, "
    "another recovery holds the target); 2 bad input (the target file, a preflight problem, a host that cannot be "
    "reached: nothing ran there; a Prefect API that cannot be reached); "
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


def confirm(question: str, yes: bool) -> None:
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
    """The target's host could not be reached before the command did anything there (`reach`): exit 2."""

    def __init__(self, error: RelaunchError) -> None:
        self.error = error
        super().__init__(str(error))


class ApiUnanswered(RelaunchError):
    """The Prefect API this command talks to cannot be reached (refused, no route, no such name, no connection in time),
    or gave no answer in time (`hung`): said with its URL and how to start one or point at one. Exit 2; a hung one exit 3,
    as the flow commands' check before any flow runs (relaunch/cli/tempserver.py, unanswered_api)."""

    def __init__(self, url: str, what: str, hung: bool = False) -> None:
        self.url, self.what, self.hung = url, what, hung
        super().__init__(f"the Prefect API at {url} {what}\n  what to do: {api_advice()}")


def api_advice() -> str:
    """How to start a Prefect API or point at one: relaunch's own `serve` where this install has it, else `make serve`
    in a clone; and where the URL in use is set."""
    from relaunch.plans.doctor import api_advice as advice

    names = {c.name or (c.callback.__name__.replace("_", "-") if c.callback else "") for c in app.registered_commands}
    start = "`relaunch serve`" if "serve" in names else "`make serve` in a clone of relaunch"
    return advice(start) + " (`prefect config view` shows where PREFECT_API_URL is set)"


def api_unanswered(exc: BaseException, api_url: str | None = None) -> ApiUnanswered | None:
    """EXC as the Prefect API not answering: a connection to it that could not be made (httpx's ConnectError or
    ConnectTimeout, anywhere in what raised it: Prefect's `Failed to reach API at URL` wraps it). None for anything
    else, and for a connection that failed to another URL than the API's (a webhook, an index)."""
    if "httpx" not in sys.modules:
        return None  # nothing has talked to an API
    import httpx

    api_url = api_url or _api_url()
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (httpx.ConnectError, httpx.ConnectTimeout)):
            try:
                asked = str(cause.request.url)
            except RuntimeError:
                asked = None  # no request attached: Prefect's client is what talks over httpx here
            if api_url and asked and not asked.startswith(api_url.rstrip("/")):
                return None
            return ApiUnanswered(api_url or asked or "(unknown)", f"cannot be reached: {type(cause).__name__}: {cause}")
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _api_url() -> str | None:
    """The API URL this process's Prefect talks to (the environment's, else Prefect's resolved settings)."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    if "prefect.settings" not in sys.modules:
        return None
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


def exit_code_of(exc: BaseException) -> int:
    """The exit code of one of relaunch's errors: 2 bad input (the target file, a preflight problem, a host that could
    not be reached before anything ran there, a Prefect API that cannot be reached), 1 every other refusal or failure;
    3 for a Prefect API that never answered (as an unexpected error)."""
    if isinstance(exc, ApiUnanswered):
        return 3 if exc.hung else 2
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
    if isinstance(inner, ApiUnanswered):
        found["api_url"] = inner.url
    return found


@contextmanager
def errors(as_json: bool = False) -> Iterator[None]:
    """One clean line for every failure: what failed and what to do; the traceback only with --debug. With --json,
    the same as a JSON object on stdout too (`error_json`), so a program reading it gets an answer for every outcome."""

    def fail(exc: BaseException, code: int, line: str, message: str | None = None) -> typer.Exit:
        print(line, file=sys.stderr)
        if as_json:
            print_json(error_json(exc, code, message))
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
        down = api_unanswered(exc)
        if down is not None:  # the likeliest trouble at night, and no bug: said as what it is, for every command
            if DEBUG["on"]:
                traceback.print_exc()
            raise fail(down, exit_code_of(down), f"relaunch: {down}") from None
        if DEBUG["on"]:
            traceback.print_exc()
        last = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        advice = "run again with --debug for the traceback, and report it if it looks like a bug"
        raise fail(exc, 3, f"relaunch: unexpected error: {last}\n  what to do: {advice}", f"unexpected error: {last}") from None


def reach(target: Any) -> Any:
    """Before a command does anything on the target's host: open the SSH route to it, the connection its commands then
    use (relaunch.wire.transport's pool). A host that cannot be reached (refused, no answer, no such name, a host key or
    key refused) ends the command here, at once: one line, exit 2, no flow run, nothing ran there. A gang is left to
    its flows, which put a spare in place of a node that cannot be reached."""
    if target.nodes or target.host.kind != "ssh":
        return target
    from relaunch.wire.ssh import SSHTransport
    from relaunch.wire.transport import transport_for

    transport = transport_for(target.host)
    if isinstance(transport, SSHTransport):
        failed = transport.reach()[-1][1]
        if failed is not None:
            raise NotReached(failed)
    return target


def print_report(report: Any, as_json: bool) -> None:
    if as_json:
        print_json(report.model_dump(mode="json"))
        return
    print("\n".join(report.timeline()))
    print(
        f"verdict: {report.verdict.value if report.verdict else 'none'}"
        + (f" ({report.cause.value})" if report.cause else "")
        + (f": {report.message}" if report.message else "")
    )


def exit_for(report: Any) -> None:
    raise typer.Exit(0 if report.verdict is not None and report.verdict.is_fine() else 1)


def run_flow(flow: Callable[..., Any], as_json: bool, **parameters: Any) -> Any:
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


def one_host(target: Any, command: str) -> Any:
    """The commands that take one host refuse a gang (exit 2) rather than act on its unused `host`."""
    if target.nodes:
        raise ConfigError(
            f"{target.name} runs on {len(target.nodes)} nodes: `relaunch {command}` takes one host; check, recover, stop and "
            "fleet take the gang (docs/multinode.md)"
        )
    return target


def print_json(data: Any) -> None:
    """What --json prints: one JSON document on stdout."""
    print(json.dumps(data, indent=2))


def stop_target(target: Any, grace_seconds: float | None = None, deliberate: bool = False) -> Any:
    """The stop on the target's host; on a gang, on every node (all at once), one result saying each node's output and
    the first failing exit code."""
    from concurrent.futures import ThreadPoolExecutor

    from relaunch.deciding.gang import indexed
    from relaunch.errors import Result
    from relaunch.plans.stop import plan_stop
    from relaunch.wire.transport import run, transport_for

    def one(node: Any) -> Result:
        return run(transport_for(node.host), plan_stop(node, grace_seconds, deliberate=deliberate), check=False)

    nodes = indexed(target)
    if not nodes.gang:
        return one(nodes.first)
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        results = list(pool.map(one, [node for _, node in nodes]))
    return Result(
        exit_code=next((r.exit_code for r in results if r.exit_code != 0), 0),
        stdout="\n".join(f"node {k} ({node.host.label}): {r.stdout.strip()}" for (k, node), r in zip(nodes, results, strict=True)),
        stderr="\n".join(r.stderr for r in results if r.stderr),
    )
