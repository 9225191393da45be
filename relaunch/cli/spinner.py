"""On a terminal, one line on stderr while a flow runs: a spinner, the step in progress, the flow run's UI link.

The step comes from relaunch.tasks.common.STEP_WATCHERS (told as each step's run begins, in this process), so
nothing polls the API. The line is rich's Status (a transient Live: gone when the flow ends, so what stays on the
terminal is what a pipe gets). Prefect's log handlers hold the terminal's stderr from before the spinner started;
while it spins they write through the spinner's console, so each log line lands above the spinner, not inside it.
Off the terminal (a pipe, a file, cron, --json) nothing is set up and not one byte differs.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID


def wanted(as_json: bool) -> bool:
    """A person watches: both output streams are a terminal, and the output is not JSON for a program."""
    return not as_json and sys.stdout.isatty() and sys.stderr.isatty()


def stream_handlers(fds: tuple[int, ...]) -> list[tuple[logging.StreamHandler[Any], int]]:
    """Every stream handler of every logger that writes to one of the file descriptors FDS (1, 2), with its fd."""
    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger))]
    found = []
    for handler in {h for logger in loggers for h in logger.handlers}:
        if isinstance(handler, logging.StreamHandler):
            try:
                fd = handler.stream.fileno()
            except (AttributeError, OSError, ValueError):
                continue  # a stream with no descriptor (a StringIO) is no terminal
            if fd in fds:
                found.append((handler, fd))
    return found


def line(flow_name: str, step: str | None, link: str | None) -> str:
    """What the spinner says: the flow, the step in progress, the flow run's link once known."""
    return "   ".join(part for part in (flow_name, step or "starting", link) if part)


def link_for(flow_run_id: UUID) -> str | None:
    """The flow run's page: PREFECT_UI_URL, else the UI beside PREFECT_API_URL (the temporary server's local URL)."""
    from prefect.utilities.urls import url_for

    return url_for("flow-run", obj_id=flow_run_id)


@contextmanager
def spinning(flow_name: str, as_json: bool) -> Iterator[None]:
    """Show the spinner for the flow FLOW_NAME while the block runs, when `wanted`; otherwise do nothing at all."""
    if not wanted(as_json):
        yield
        return
    from rich.console import Console
    from rich.file_proxy import FileProxy
    from rich.status import Status
    from rich.text import Text

    from relaunch.tasks.common import STEP_WATCHERS

    console = Console(file=sys.stderr)
    shown: dict[str, str | None] = {"step": None, "link": None}

    def render() -> Text:
        return Text(line(flow_name, shown["step"], shown["link"]), no_wrap=True, overflow="ellipsis")

    status = Status(render(), console=console)

    def watch(step: str, flow_run_id: UUID | None) -> None:
        # The first flow run seen is the command's own (a fleet's recoveries are its subflows).
        if shown["link"] is None and flow_run_id is not None:
            shown["link"] = link_for(flow_run_id)
        shown["step"] = step
        status.update(render())

    terminal = [(handler, getattr(handler, "console", None), handler.stream) for handler, _ in stream_handlers((1, 2))]
    STEP_WATCHERS.append(watch)
    try:
        with status:
            proxies = []
            for handler, rich_console, stream in terminal:
                proxy = FileProxy(console, stream)
                proxies.append(proxy)
                handler.setStream(proxy)  # type: ignore[arg-type]
                if rich_console is not None:  # Prefect's console handler prints through its own rich Console
                    rich_console.file = proxy
            try:
                yield
            finally:
                for proxy in proxies:
                    proxy.flush()
                for handler, rich_console, stream in terminal:
                    handler.setStream(stream)
                    if rich_console is not None:
                        rich_console.file = stream
    finally:
        STEP_WATCHERS.remove(watch)
