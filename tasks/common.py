"""What every step shares: the task decorator (retries for transport faults only) and step records."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar
from uuid import UUID

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext, TaskRunContext

from relaunch.config import Target
from relaunch.errors import Result, is_transient
from relaunch.tasks import secrets
from relaunch.wire.commands import Command
from relaunch.wire.transport import Advice, run, transport_for

# Keys and passphrases in Secret blocks are read through Prefect, wherever a task reaches a host.
secrets.install()

F = TypeVar("F", bound=Callable[..., Any])


def retry_transient_only(task: Any, task_run: Any, state: Any) -> bool:
    """Retry when the wire failed; a command that failed on the host is an answer, not a fault."""
    try:
        state.result()
    except Exception as exc:  # noqa: BLE001 - we classify, not handle
        return is_transient(exc)
    return False


# Told of each step as its run begins, with the step run's name and its flow run's id, in the thread that runs it:
# how the CLI's spinner (relaunch/cli/spinner.py) learns the step in progress without asking the API. Process-local.
StepWatcher = Callable[[str, UUID | None], None]
STEP_WATCHERS: list[StepWatcher] = []


def _run_name(name: str) -> Callable[..., str]:
    """`step@host`, computed by Prefect once as the step's run begins: the moment the watchers are told."""

    # Prefect passes the step's arguments to a callable with a `parameters` argument (prefect.tasks.TaskRunNameCallbackWithParameters).
    def named(parameters: dict[str, Any]) -> str:
        run_name = f"{name}@{parameters['target'].host.hostname}"
        flow_run = FlowRunContext.get()
        for watch in list(STEP_WATCHERS):
            try:
                watch(run_name, flow_run.flow_run.id if flow_run and flow_run.flow_run else None)
            except Exception as exc:  # noqa: BLE001 - a display must never fail a recovery step
                log().debug("step watcher %r failed: %s", watch, exc)
        return run_name

    return named


def step_task(name: str, retries: int = 2) -> Callable[[F], F]:
    """A recovery step: named `step@host` in the UI, retried with backoff on transport faults only; every progress
    artifact it opened ends with what came of it (finished_progress)."""

    def decorate(fn: F) -> F:
        return task(  # type: ignore[return-value]
            name=name,
            task_run_name=_run_name(name),
            retries=retries,
            retry_delay_seconds=[2, 10, 30],
            retry_condition_fn=retry_transient_only,
            cache_policy=NO_CACHE,
        )(finished_progress(fn))

    return decorate


# The progress artifacts a step's run opened, for it to finish when it ends (a ContextVar: one list per step call).
_OPEN_PROGRESS: ContextVar[list[Progress] | None] = ContextVar("relaunch_open_progress", default=None)


def finished_progress(fn: F) -> F:
    """`fn`, with every progress artifact opened while it runs brought to its end as it returns (`done`, or the
    verdict of a health check: `healthy: ...`) or raises (`failed: ...`): none is left at `starting for 0 s`."""

    @functools.wraps(fn)
    def run_step(*args: Any, **kwargs: Any) -> Any:
        opened: list[Progress] = []
        token = _OPEN_PROGRESS.set(opened)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            for p in opened:
                p.finish(f"failed: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"[:400], done=False)
            raise
        finally:
            _OPEN_PROGRESS.reset(token)
        for p in opened:
            p.finish(outcome_of(result))
        return result

    return run_step  # type: ignore[return-value]


def outcome_of(result: Any) -> str:
    """A step's ending for its progress artifact: a health check's final verdict and summary, else `done`."""
    diagnosis = getattr(result, "diagnosis", None)
    if diagnosis is not None:
        return f"{diagnosis.verdict.value}: {diagnosis.summary}"[:400]
    return "done"


def execute(target: Target, command: Command, *, check: bool = True, advice: Advice = "") -> Result:
    return run(transport_for(target.host), command, check=check, advice=advice)


def log() -> Any:
    try:
        return get_run_logger()
    except Exception:  # outside a flow or task run (plain function call in tests)
        import logging

        return logging.getLogger("relaunch")


class Clock:
    """Wall time of a step, set when its `with timed()` block ends."""

    seconds: float = 0.0


@contextmanager
def timed() -> Iterator[Clock]:
    clock, start = Clock(), time.monotonic()
    yield clock
    clock.seconds = round(time.monotonic() - start, 3)


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys take lowercase letters, digits and dashes only."""
    return "-".join("".join(c if c.isalnum() else "-" for c in part.lower()) for part in parts)


class Progress:
    """A Prefect progress artifact for long steps; silent outside a run."""

    def __init__(self, key: str, description: str) -> None:
        self.id: UUID | None = None
        self.percent, self.description, self.finished = 0.0, description, False
        if TaskRunContext.get() is None:
            return
        opened = _OPEN_PROGRESS.get()
        if opened is not None:
            opened.append(self)
        try:
            from prefect.artifacts import create_progress_artifact

            self.id = create_progress_artifact(progress=0.0, key=key, description=description)
        except Exception as exc:  # the UI view is a nicety; never fail a recovery for it
            log().debug("progress artifact unavailable: %s", exc)

    def finish(self, outcome: str, done: bool = True) -> None:
        """The artifact's last word: at 100% with the outcome (`done` keeps a step's own last description); at the
        point it stopped, with the failure, when `done` is False. Once."""
        if self.finished:
            return
        if done and outcome == "done" and self.percent >= 100:
            self.finished = True
            return
        description = (f"{self.description}: done" if outcome == "done" else outcome) if done else f"{self.description}: {outcome}"
        self.update(100.0 if done else self.percent, description, announce=False)
        self.finished = True

    def update(self, percent: float, description: str, announce: bool = True) -> None:
        self.percent, self.description = percent, description
        if announce:
            log().info("%s (%.0f%%)", description, percent)
        if self.id is None:
            return
        try:
            from prefect.artifacts import update_progress_artifact

            update_progress_artifact(self.id, progress=percent, description=description)
        except Exception as exc:
            log().debug("progress artifact update failed: %s", exc)
