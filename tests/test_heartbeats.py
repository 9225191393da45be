"""Flow runs keep Prefect's heartbeats (what marks a killed run Crashed) and end without waiting for their sleep."""

from __future__ import annotations

import threading
import time

from prefect import flow_engine

import relaunch.flows  # noqa: F401 - importing the flows installs the change under test
from relaunch.flows.heartbeats import installed


class Engine:
    """What Prefect's heartbeat thread asks of its flow run engine."""

    heartbeat_seconds = 30
    flow_run = None

    def __init__(self) -> None:
        self.emitted = threading.Event()
        self.count = 0

    def _build_heartbeat_event_template(self) -> tuple[dict, list]:
        return {}, []

    def _emit_flow_run_heartbeat(self, resource: dict, related: list) -> None:
        self.count += 1
        self.emitted.set()

    logger = __import__("logging").getLogger("test-heartbeats")


def test_the_flows_make_prefects_heartbeat_sleep_end_with_the_flow_run():
    assert installed(), "Prefect's flow engine changed: flows/heartbeats.py no longer applies"


def test_a_flow_run_still_sends_its_heartbeat_and_its_end_does_not_wait_for_the_heartbeats_sleep():
    engine = Engine()
    threads = set(threading.enumerate())
    with flow_engine._send_heartbeats(engine):
        assert engine.emitted.wait(10), "a heartbeat at the start of the run"
        (heartbeat,) = set(threading.enumerate()) - threads
        # Prefect's thread is now in its whole-second sleep; unchanged, the exit below waits out most of it.
        start = time.monotonic()
    ended = time.monotonic() - start
    assert not heartbeat.is_alive() and engine.count == 1
    assert ended < 0.5, f"the run's end waited {ended:.2f} s for the heartbeat thread"


def test_a_sleep_outside_a_flow_runs_heartbeat_sleeps_its_time():
    start = time.monotonic()
    flow_engine.time.sleep(0.3)
    assert time.monotonic() - start >= 0.3
