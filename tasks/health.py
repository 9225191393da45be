"""Step 7: poll until the verdict settles. One round trip per poll; a death ends the wait at once."""

from __future__ import annotations

import time

from pydantic import BaseModel, Field

from relaunch.commands import Command, script
from relaunch.config import Target
from relaunch.diagnosis import Diagnosis, Progress, advance, diagnose
from relaunch.host import host_script
from relaunch.logtext import FAILURE_WORDS
from relaunch.runfiles import TAIL_BYTES, TAIL_LINES, new_nonce, parse_snapshot
from relaunch.snapshot import HealthSnapshot
from relaunch.verdicts import Verdict
from tasks.common import Progress as ProgressArtifact
from tasks.common import artifact_key, execute, log, step_task

# The progress artifact of a start-up is updated at most this often.
PROGRESS_UPDATE_SECONDS = 5.0


class HealthResult(BaseModel):
    diagnosis: Diagnosis
    snapshot: HealthSnapshot
    polls: int = Field(description="Round trips made.")
    seconds: float = Field(description="Time spent waiting for the verdict to settle.")


def plan_snapshot(
    target: Target, wait_seconds: float, nonce: str, tail_lines: int = TAIL_LINES, wake_on_log_write: bool = False
) -> Command:
    """One poll; the wait is sent in milliseconds so a fractional poll interval is honoured.

    With `wake_on_log_write` the wait also ends when the trainer's log is written."""
    args = (target.state_path, target.tmux_session, str(int(wait_seconds * 1000)), str(tail_lines), "1", nonce)
    args += (target.venv_dir, target.inductor_cache_dir, str(TAIL_BYTES), FAILURE_WORDS, target.log_dir, target.checkpoint_dir or "")
    args += ("1" if wake_on_log_write else "0",)
    return script(host_script("snapshot"), *args, label="health poll", timeout_seconds=wait_seconds + 60)


def collect_snapshot(target: Target, wait_seconds: float = 0, wake_on_log_write: bool = False) -> HealthSnapshot:
    nonce = new_nonce()
    result = execute(target, plan_snapshot(target, wait_seconds, nonce, wake_on_log_write=wake_on_log_write))
    return parse_snapshot(result.stdout, target.host.label, nonce)


def poll_until_settled(target: Target, timeout_seconds: float | None = None) -> HealthResult:
    """Poll with a long-poll wait on the host; return the first settled verdict (or `starting` at timeout)."""
    t = target.thresholds
    deadline = time.monotonic() + (timeout_seconds if timeout_seconds is not None else t.settle_timeout_seconds)
    start, progress, polls, last = time.monotonic(), Progress(), 0, None
    # Created at the first `starting` verdict: a check that settles at once (most of them) makes no API call for it.
    bar: ProgressArtifact | None = None
    bar_updated = float("-inf")  # the first start-up poll shows at once
    while True:
        wait = 0 if polls == 0 else min(t.poll_interval_seconds, max(0.0, deadline - time.monotonic()))
        snap = collect_snapshot(target, wait, wake_on_log_write=stepping_toward_a_verdict(last, progress))
        polls += 1
        progress = advance(progress, snap, t)
        diagnosis = diagnose(snap, t, progress, min_free_disk_gb=target.min_free_disk_gb)
        if last is None or diagnosis.verdict is not last:
            log().info("%s: %s (%s)", target.name, diagnosis.verdict.value, diagnosis.summary)
            last = diagnosis.verdict
        if diagnosis.verdict is Verdict.STARTING and time.monotonic() - bar_updated >= PROGRESS_UPDATE_SECONDS:
            # One API round trip per update: a few a minute are enough for a start-up that takes minutes.
            bar_updated = time.monotonic()
            bar = bar or ProgressArtifact(artifact_key(target.name, "health"), "waiting for the verdict to settle")
            elapsed = snap.seconds_since_launch or 0.0
            bar.update(min(99.0, 100.0 * elapsed / max(t.startup_grace_seconds, 1.0)), diagnosis.summary, announce=False)
        if diagnosis.settled or time.monotonic() >= deadline:
            return HealthResult(diagnosis=diagnosis, snapshot=snap, polls=polls, seconds=round(time.monotonic() - start, 3))


def stepping_toward_a_verdict(last: Verdict | None, progress: Progress) -> bool:
    """A start-up whose trainer prints step lines: the next line may settle the verdict, so a poll returns at it.

    Only then: a step line settles a start-up in a few polls, while a wait on a chatty log in other states
    (a stall window, a long start-up's loading lines) would poll at every line."""
    return last is Verdict.STARTING and progress.last_step is not None


@step_task("check_health")
def check_health(target: Target, timeout_seconds: float | None = None) -> HealthResult:
    return poll_until_settled(target, timeout_seconds)
