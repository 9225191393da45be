"""What the watch (`relaunch watch`) makes of one cheap look at a target's run: pure, no Prefect, no host.

A look (relaunch/host/pulse.sh) reads only the run on record, whether its recorded trainer and supervisor live, its
exit record and a person's stop. The watch never stops anything and never judges a run by itself: a death it sees
hands the target to the recover-training flow, whose full check judges it with all the evidence and whose locks and
never-harm rules hold as for any recovery. What is decided here is only whether to hand it over now.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from pydantic import BaseModel, Field

from relaunch.config import Thresholds
from relaunch.judging.progress import Motion, Reading, read_progress
from relaunch.judging.snapshot import ProgressSample


class Seen(str, Enum):
    """What one look means to the watch."""

    RUNNING = "running"  # the trainer on record lives
    IDLE = "idle"  # nothing to watch: never launched, stopped by a person, or the state folder is another target's
    DYING = "dying"  # the trainer is gone and its supervisor is still recording its exit: look again next round
    LAUNCHING = "launching"  # a launch under way: its run is current, its supervisor has not recorded a PID yet
    DIED = "died"  # the trainer on record is gone, its exit recorded (or no one left to record it): hand it over
    HUNG = "hung"  # the trainer lives, but its progress record stood still for the stall window's floor: hand it over

    def hands_over(self) -> bool:
        return self is Seen.DIED


# The record's readings the watch hands over as a hang: nothing in the tree moved (flat), it waits on something alive
# outside it (blocked: the recovery escalates, naming it), or its GPUs spin over a still host (the recovery's check
# samples the stacks before anything is stopped). The full check judges each again with its own window.
HANDED_AS_HUNG = frozenset({Motion.FLAT, Motion.BLOCKED, Motion.GPU_SPIN})


def stillness(pulse: Pulse, thresholds: Thresholds, gpu_indexes: Sequence[int] | None = None) -> Reading | None:
    """The live run's progress record over the stall window's floor (None: no record came with the look)."""
    if not pulse.pid_alive or not pulse.progress:
        return None
    floor = thresholds.stall_window_floor_seconds
    return read_progress(pulse.progress, floor, thresholds.progress_sample_seconds, gpu_indexes, pulse.host_now_epoch)


def seen(pulse: Pulse, thresholds: Thresholds | None = None, gpu_indexes: Sequence[int] | None = None) -> Seen:
    """The look read as the watch reads it. A death it hands over is judged again by the recovery's full check: a run
    that finished, or one a person ends later, is left alone there. A live run is hung where its record says so over
    the floor of its stall window (with `thresholds`); a pause (state T) is a person's, and no hang."""
    if pulse.foreign or pulse.run_id is None or pulse.stopped:
        return Seen.IDLE
    if pulse.pid_alive:
        reading = stillness(pulse, thresholds, gpu_indexes) if thresholds is not None else None
        return Seen.HUNG if reading is not None and reading.motion in HANDED_AS_HUNG else Seen.RUNNING
    if pulse.exit_code is None and pulse.supervisor_alive:
        return Seen.DYING
    if pulse.pid is None and pulse.exit_code is None and launching(pulse):
        return Seen.LAUNCHING
    return Seen.DIED


# How long after a run's start a look may find no PID recorded and read a launch under way: launch.sh waits up to 30 s
# for the supervisor's record (plans/launch.py PID_WAIT_SECONDS), and fails the launch after; twice that, for a loaded host.
LAUNCH_SECONDS = 60.0


def launching(pulse: Pulse) -> bool:
    """The run became current moments ago and its supervisor has recorded nothing yet: a launch, not a death."""
    if pulse.started_at_epoch is None or pulse.host_now_epoch is None:
        return False
    return 0 <= pulse.host_now_epoch - pulse.started_at_epoch < LAUNCH_SECONDS


def hand_over(pulse: Pulse, handled: str | None) -> bool:
    """Whether this look starts a recovery: a death of a run not handed over before (`handled`: the run id of the last
    death this watch handed over). A recovery that ended without a new run (finished, escalated) is not started again
    for the same death every round; the next run's death is."""
    return seen(pulse).hands_over() and pulse.run_id != handled


class Pulse(BaseModel):
    """One cheap look at a target's current run."""

    run_id: str | None = Field(None, description="The run on record; None: never launched.")
    pid: int | None = Field(None, description="Its recorded trainer PID.")
    pid_alive: bool = Field(False, description="The recorded PID lives with its recorded start time.")
    supervisor_alive: bool = Field(False, description="The run's supervisor, which records the trainer's exit code, lives.")
    exit_code: int | None = Field(None, description="The exit record, once the supervisor wrote it.")
    stopped: bool = Field(False, description="A person stopped the target (`relaunch stop`, or tmux kill-session).")
    foreign: str | None = Field(None, description="The state folder is another target's (its identity): never acted on.")
    host_now_epoch: float | None = Field(None, description="The host's clock at the look.")
    started_at_epoch: float | None = Field(None, description="When the current run was launched (RUN/started_at), host clock.")
    progress: list[ProgressSample] = Field(
        default_factory=list, description="A live run's progress record (RUN/progress), thinned, oldest first."
    )
