"""The `relaunch` process: its start-up before the app runs (the Secret-block loader, Prefect's defaults, the host
reached and the temporary server started before the flows are imported), in this process (`main`, from
relaunch/cli/entry.py) or in an agent's child (`run_forked`, from relaunch/cli/agent_server.py), and its exit."""

from __future__ import annotations

import os
import sys

import typer

from relaunch.cli.app import app
from relaunch.cli.root import errors, reach
from relaunch.cli.tempserver import FLOW_MODULES, api_client_defaults, command_of, runs_flow, start_for_cli, unanswered_api
from relaunch.config import load_target
from relaunch.errors import RelaunchError
from relaunch.tasks import secrets


def prepare_environment() -> None:
    """A process that runs relaunch's commands (this one, an agent or an agent's child), before Prefect reads its
    settings: the loader of keys and passphrases kept in Secret blocks, and relaunch's defaults for Prefect."""
    # Keys and passphrases in Secret blocks are read through Prefect (imported only when a host needs one).
    secrets.install()
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # relaunch's own log lines (SSH connects, reconnects, host-key notes) go to the flow run's logs in the UI.
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "relaunch")
    # A per-request timeout shorter than Prefect's 60 s, unless the user set one (relaunch/cli/tempserver.py, "Bounded waits").
    api_client_defaults()


def main() -> None:
    prepare_environment()
    _reach_before_the_server(sys.argv[1:])
    # Before anything imports Prefect, and from the main thread: Prefect's own temporary server outlives a killed CLI.
    server = start_for_cli(sys.argv[1:])
    if runs_flow(sys.argv[1:]):
        _import_flows()
        if server is None:
            _exit_if_api_unanswered()
    _run_app()


def _reach_before_the_server(argv: list[str]) -> None:
    """`check` and `recover`: the host is reached (`reach`) before the temporary Prefect server starts and the flows
    are imported, seconds of CPU a host that cannot be reached does not need: it is said, exit 2, in well under a
    second. The connection stays in the pool for the flow. Left to the command as before: a bad target file, a key or
    passphrase in a Secret block or a ~/.ssh/config alias (they may need the Prefect API), anything unusual in ARGV."""
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
        with errors("--json" in rest):
            reach(target)
    except typer.Exit as exc:
        _exit_now(exc.exit_code)


def _exit_if_api_unanswered() -> None:
    """Before any flow runs (so before any host action): a configured API that never answers ends the command, exit 3."""
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

    flows = dict.fromkeys(module for modules in FLOW_MODULES.values() for module in modules)
    for module in (*flows, "fastapi.encoders", "relaunch.wire.ssh", "relaunch.demo.scenarios"):
        importlib.import_module(module)


def _run_app() -> None:
    try:
        app()
    except SystemExit as exc:
        _exit_now(exc.code)


def _import_flows() -> None:
    """Import the flow modules (Prefect: ~1,200 modules, 1-2 s) with the garbage collector off, then freeze them.

    What an import allocates lives until exit, so the collections those allocations trigger free nothing
    (measured: 0.2 s of CPU); frozen, later collections during the flow skip it too. A failed import is
    left to the command, which reports it as before.
    """
    import gc
    import importlib

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
    _drain_prefect()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed pipe or stream: nothing more can reach it
    os._exit(status)


def _drain_prefect(timeout_seconds: float = 10.0) -> None:
    """Send what Prefect's log and event workers still hold, while the temporary server answers.

    They flush from threading's exit hooks, which run before atexit's at a normal exit and not at all before
    `os._exit`: without this, the server's atexit stop came first and each queued batch failed on the terminal
    ("--- Error logging to API --- All connection attempts failed")."""
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout_seconds)
