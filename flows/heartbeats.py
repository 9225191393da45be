"""Flow runs end when their work ends, not up to a second later.

Prefect's flow-run heartbeat thread (prefect.flow_engine._send_heartbeats, Prefect 3.9) sleeps in whole
seconds, `time.sleep(1)`, and checks its stop event only between sleeps; the flow run's end joins it. So
every flow run, `relaunch check` included, waits a random 0-1 s after its last task (measured: 0.97 s between
the recovery's last event and "Stopped flow run heartbeat context"). The heartbeats are kept, as they are
what marks a killed run Crashed (automations.yaml); only their sleep is made to end when the flow does.

How: the heartbeat thread runs in a copy of the flow's context, so a context variable set around Prefect's
own `_send_heartbeats` reaches it; the module's `time.sleep` becomes a wait on that variable's event, set as
the flow ends. Everywhere else (no event in the context) it is `time.sleep`. Where Prefect's internals are not
as expected this leaves Prefect as it is: `installed()` says whether it took, and a test asserts that it did.
"""

from __future__ import annotations

import contextvars
import threading
import time
import types
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

_WAKE: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("relaunch_heartbeat_wake", default=None)


class _WakeableTime(types.ModuleType):
    """The `time` module, but a sleep inside a flow run's heartbeat context ends when that flow run does."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        wake = _WAKE.get()
        if wake is None:
            time.sleep(seconds)
        elif wake.wait(seconds):
            # Woken: the flow's stop event follows within microseconds; a short nap until the loop sees it.
            time.sleep(0.001)


def _wakeable(original: Callable[..., AbstractContextManager[None]]) -> Callable[..., AbstractContextManager[None]]:
    @contextmanager
    def send_heartbeats(engine: Any, join_on_exit: bool = True) -> Iterator[None]:
        wake = threading.Event()
        token = _WAKE.set(wake)
        try:
            with original(engine, join_on_exit):
                try:
                    yield
                finally:
                    # Before Prefect's own exit sets its stop event and joins the thread: the thread wakes,
                    # finds the stop event set (at once, or after a few turns of its loop) and returns.
                    wake.set()
        finally:
            _WAKE.reset(token)

    send_heartbeats.relaunch_wakeable = True  # type: ignore[attr-defined]
    return send_heartbeats


def install() -> bool:
    """Make flow-run heartbeat sleeps end with their flow run; idempotent. Whether it is in place."""
    from prefect import flow_engine

    original = getattr(flow_engine, "_send_heartbeats", None)
    if original is None or getattr(flow_engine, "time", None) is not time:
        return installed()
    flow_engine._send_heartbeats = _wakeable(original)
    flow_engine.time = _WakeableTime("time")
    return True


def installed() -> bool:
    from prefect import flow_engine

    return getattr(getattr(flow_engine, "_send_heartbeats", None), "relaunch_wakeable", False) and isinstance(
        getattr(flow_engine, "time", None), _WakeableTime
    )
