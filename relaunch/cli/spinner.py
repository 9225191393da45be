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


def line(flow_name: str, step: str | None, link: str | None, width: int) -> str:
    """What the spinner says in WIDTH columns: the flow, the step in progress, the flow run's link once known.
    Narrow, the flow's name goes first, so the link stays whole (a cut link is no link); then the end is cut."""
    for parts in ((flow_name, step or "starting", link), (step or flow_name, link)):
        said = "   ".join(part for part in parts if part)
        if len(said) <= width:
            return said
    return said[: max(width - 1, 0)] + "…"


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

    terminal = stream_handlers((1, 2))
    # Prefect's console handler prints through its own rich Console: the spinner shares it, so that rich puts each
    # log line above the spinner. (A FileProxy would not do: a rich Console unwraps one, `rich_proxied_file`.)
    consoles = [c for h, fd in terminal if fd == 2 and isinstance(c := getattr(h, "console", None), Console)]
    console = consoles[0] if consoles else Console(file=sys.stderr)
    others = [(h, h.stream) for h, _ in terminal if getattr(h, "console", None) is not console]
    shown: dict[str, str | None] = {"step": None, "link": None}

    def render() -> Text:
        # Two columns go to the spinner's frame and its space.
        return Text(line(flow_name, shown["step"], shown["link"], console.width - 2))

    status = Status(render(), console=console)

    def watch(step: str, flow_run_id: UUID | None) -> None:
        # The first flow run seen is the command's own (a fleet's recoveries are its subflows).
        if shown["link"] is None and flow_run_id is not None:
            shown["link"] = link_for(flow_run_id)
        shown["step"] = step
        status.update(render())

    STEP_WATCHERS.append(watch)
    try:
        with status:
            proxies = [FileProxy(console, stream) for _, stream in others]
            for (handler, _), proxy in zip(others, proxies):
                handler.setStream(proxy)  # type: ignore[arg-type]
            try:
                yield
            finally:
                for (handler, stream), proxy in zip(others, proxies):
                    proxy.flush()
                    handler.setStream(stream)
    finally:
        STEP_WATCHERS.remove(watch)
