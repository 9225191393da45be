"""What a live run's processes do, from the run's own history: pure, no I/O.

An expert at the host does not call a run stalled on one look at its log. They watch it for a while and ask:
did the step number advance, did it write anything (its log, wherever that really is, a checkpoint, a file of its
own), did its processes burn CPU, and if they did, are their stacks computing or waiting? The host journals every
poll of every check (RUN/journal, snapshot.sh); this module reads that history:

- a stall window is judged only over history that spans it: a check with less history watches, it stops nothing;
- a write is a change between polls (a size, an mtime), never an mtime held against the host's clock;
- CPU gained over the window is work unless every stack sampled over it waits (a collective, a barrier, a lock,
  a queue, a sleep) while the tree still burns CPU: an NCCL hang spins its GPU and a polling thread a core, so busy
  alone is not progress; a tree that computed (a silent evaluation) and waits only since moments ago (a GPU-bound
  step) is judged from when its work ended;
- where the stacks cannot be read (asked for HANG_SAMPLES times, no thread in any dump), a busy tree is given the
  benefit of the doubt for HANG_CEILING_FACTOR windows; a look that has not asked yet asks first.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from relaunch.judging.snapshot import HealthSnapshot, JournalPoll

# Linux reports /proc CPU times in USER_HZ ticks, 100 a second on every architecture it runs on.
TICKS_PER_SECOND = 100
# Less than this share of one core, averaged over the window, is no work: torchrun's monitor, a heartbeat thread.
IDLE_CORES = 0.05
# Samples of waiting stacks, at least this many and over at least this share of the window, make a hang.
HANG_SAMPLES = 3
# Samples in one and the same active place, at least this many, make a spin (a polling loop, not a step): a real
# step's innermost frame moves between samples.
SPIN_SAMPLES = 6
# A busy tree whose stacks cannot be read is called stalled only after this many windows with no step and no write.
HANG_CEILING_FACTOR = 6.0

# py-spy's thread header and frames (`Thread 0x7F (idle): "MainThread"`, then `    wait (threading.py:320)`).
THREAD = re.compile(r"^Thread \S+ \((?P<state>[^)]*)\)")
FRAME = re.compile(r"^\s+(?P<function>[^\s(]+) \((?P<where>[^)]*)\)")
# Innermost frames that wait for someone else: a lock, a condition, a queue, a sleep, a socket, a collective or a
# barrier, a device synchronisation. Any other frame on an active thread is work (forward, backward, save, compile).
WAITING_FRAME = re.compile(
    r"^(?:wait|_wait_for_tstate_lock|acquire|get|join|sleep|select|poll|epoll|recv|recv_into|accept|read|readinto|"
    r"_recv_msg|barrier|monitored_barrier|all_reduce|allreduce|all_gather|all_gather_into_tensor|all_to_all|broadcast|"
    r"reduce_scatter|reduce_scatter_tensor|reduce|gather|scatter|send|isend|irecv|synchronize|item|_wait|wait_stream|"
    r"store_based_barrier|_store_based_barrier|_sync|_wait_for_workers|_poll|serve_forever)$"
)
# Frames that are always someone's wait whatever the function is called: torch.distributed's collectives and c10d.
WAITING_WHERE = re.compile(r"torch/distributed/(?:distributed_c10d|c10d_logger|elastic/agent)|/threading\.py|/queue\.py|/selectors\.py")


def stack_sample(dump: str) -> tuple[bool, str]:
    """(every thread of every process waits, where the active threads are): a thread waits when py-spy calls it idle or
    its innermost frame is a wait. The place lets samples that spin in one spot (a polling loop) count as waiting.

    An empty dump (py-spy could not attach, no Python process) is no evidence of waiting."""
    threads, waiting, places = 0, True, []
    for state, innermost in _threads(dump):
        threads += 1
        if state.startswith("idle") or innermost is None:
            continue  # idle, or a native thread with no Python frame: no work seen
        function, where = innermost
        places.append(f"{function} ({where})")
        if not (WAITING_FRAME.match(function.rsplit(".", 1)[-1]) or WAITING_WHERE.search(where)):
            waiting = False
    return waiting and threads > 0, "; ".join(sorted(places))


def _threads(dump: str) -> list[tuple[str, tuple[str, str] | None]]:
    """(state, innermost frame) per thread; py-spy lists a thread's frames innermost first."""
    out: list[tuple[str, tuple[str, str] | None]] = []
    for line in dump.splitlines():
        head = THREAD.match(line)
        if head:
            out.append((head["state"], None))
            continue
        frame = FRAME.match(line)
        if frame and out and out[-1][1] is None:
            out[-1] = (out[-1][0], (frame["function"], frame["where"]))
    return out


@dataclass(frozen=True)
class Activity:
    """A live run's history, as seconds on the host's clock before its latest poll."""

    history_seconds: float  # how long the run has been watched (its journal, this check's polls)
    since_step_seconds: float | None  # since the step number last advanced; None: no advance was ever seen
    steps_journaled: bool  # earlier polls journaled the steps they read (else only writes and CPU are history)
    since_write_seconds: float | None  # since the log, a file it writes or checkpoint_dir last changed; None: never seen
    cpu_cores: float | None  # CPU used over the window, in cores (None: not measured)
    per_step_seconds: tuple[float, ...]  # step intervals seen across polls and checks
    stacks_waiting: bool | None  # None: not sampled (enough); True: every sample waited; False: one computed
    # HANG_SAMPLES stack dumps were taken since the run went quiet and none could be read (py-spy could not attach).
    stacks_unreadable: bool = False
    # Since the tree last burned CPU between two polls (0: it does now; None: not measured). Stacks sampled after a
    # busy stretch (a silent evaluation) that wait now (a GPU-bound step) say nothing of the stretch before them.
    idle_for_seconds: float | None = None
    # The run's mean step time over its journaled steps since they last went back (None: fewer than two steps seen).
    mean_step_seconds: float | None = None

    def busy(self) -> bool:
        return self.cpu_cores is not None and self.cpu_cores >= IDLE_CORES


def read_activity(
    snap: HealthSnapshot, last_step: int | None, window: float, stack_samples: tuple[tuple[float, bool, str], ...] = ()
) -> Activity | None:
    """The run's history from its journal (None where the host kept none: an older host script, a pure test)."""
    polls = snap.journal
    now = snap.host_now_epoch
    if not polls or now is None:
        return None
    history = max(0.0, now - polls[0].at_epoch)
    steps = [(s.at_epoch, s.step) for s in snap.journal_steps]
    if last_step is not None:
        steps.append((now, last_step))
    advanced_at: float | None = None
    per_step: list[float] = []
    previous: tuple[float, int] | None = None
    span: tuple[float, int] | None = None  # the first sighting of the steps that have only gone up since
    for at, step in steps:
        if previous is not None and step > previous[1]:
            advanced_at = at
            if at > previous[0]:
                per_step.append((at - previous[0]) / (step - previous[1]))
        if previous is not None and step < previous[1]:
            span = None  # a step that went back (a relaunch by hand in the same run folder, a resume) starts again
        if previous is None or step != previous[1]:
            previous = (at, step)
            span = span or previous
    # The mean step time over that span: each poll's sighting comes late by its own latency, so on a loaded host one
    # interval between two sightings can read far shorter than the run's (a late sighting, then a prompt one); over
    # the span only its two ends carry that error.
    mean_step = None
    if span is not None and previous is not None and previous[1] > span[1] and previous[0] > span[0]:
        mean_step = (previous[0] - span[0]) / (previous[1] - span[1])
    written_at: float | None = None
    for before, after in zip(polls, polls[1:]):
        if (
            after.log_size_bytes != before.log_size_bytes
            or after.written_bytes != before.written_bytes
            or after.written_mtime_epoch != before.written_mtime_epoch
            or after.checkpoint_mtime_epoch != before.checkpoint_mtime_epoch
        ):
            written_at = after.at_epoch
    cpu = _cpu_cores(polls, now, window)
    since_step = None if advanced_at is None else now - advanced_at
    since_write = None if written_at is None else now - written_at
    quiet_for = min(x if x is not None else history for x in (since_step, since_write))
    return Activity(
        history_seconds=history,
        since_step_seconds=since_step,
        steps_journaled=bool(snap.journal_steps),
        since_write_seconds=since_write,
        cpu_cores=cpu,
        per_step_seconds=tuple(per_step[-20:]),
        mean_step_seconds=mean_step,
        stacks_waiting=_stacks_verdict(stack_samples, now - quiet_for),
        stacks_unreadable=_unreadable(stack_samples, now - quiet_for),
        idle_for_seconds=_idle_for(polls, now),
    )


def _idle_for(polls: list[JournalPoll], now: float) -> float | None:
    """Seconds since the end of the last stretch between two polls in which the tree used IDLE_CORES or more."""
    for before, after in zip(reversed(polls[:-1]), reversed(polls[1:])):
        span = after.at_epoch - before.at_epoch
        if span <= 0:
            continue
        gained = after.cpu_ticks - before.cpu_ticks
        if gained < 0 or gained / TICKS_PER_SECOND / span >= IDLE_CORES:
            return max(0.0, now - after.at_epoch)
    return None if len(polls) < 2 else max(0.0, now - polls[0].at_epoch)


def _cpu_cores(polls: list[JournalPoll], now: float, window: float) -> float | None:
    """CPU over the last window (or the history there is), in cores; a tree whose count fell lost processes: busy."""
    latest = polls[-1]
    then = next((p for p in reversed(polls) if p.at_epoch <= now - window), polls[0])
    span = latest.at_epoch - then.at_epoch
    if span <= 0:
        return None
    gained = latest.cpu_ticks - then.cpu_ticks
    if gained < 0:
        return float("inf")
    return gained / TICKS_PER_SECOND / span


def _stacks_verdict(samples: tuple[tuple[float, bool, str], ...], quiet_since: float) -> bool | None:
    """Over the samples taken since the run went quiet: True: they all wait (HANG_SAMPLES of them), or spin in one and
    the same place (SPIN_SAMPLES); False: they compute in more than one place; None: too few to tell.

    A dump with no thread in it (py-spy could not attach: ptrace refused, the process gone) is no sample at all: six
    of them are not six samples of one place."""
    recent = [sample for sample in samples if sample[0] >= quiet_since and not _empty(sample)]
    if len(recent) >= HANG_SAMPLES and all(waiting for _, waiting, _ in recent):
        return True
    working = {place for _, waiting, place in recent if not waiting}
    if len(working) > 1:
        return False
    if len(recent) >= SPIN_SAMPLES and len(working) == 1 and all(place == recent[0][2] for _, _, place in recent):
        return True  # the same active frames, line for line, in every sample: a loop that spins, not a step that runs
    return None


def _empty(sample: tuple[float, bool, str]) -> bool:
    """A dump in which no thread was read (stack_sample's (False, '')): py-spy failed, nothing was seen."""
    return not sample[1] and not sample[2]


def _unreadable(samples: tuple[tuple[float, bool, str], ...], quiet_since: float) -> bool:
    """Stacks were asked for since the run went quiet, HANG_SAMPLES times or more, and not one dump could be read."""
    recent = [sample for sample in samples if sample[0] >= quiet_since]
    return len(recent) >= HANG_SAMPLES and all(_empty(sample) for sample in recent)


def typical_step_seconds(activity: Activity | None, within_check: tuple[float, ...]) -> float | None:
    """The run's step interval from every poll that saw steps advance, this check's and earlier ones': the median of
    the intervals between sightings, or the mean over the whole span where that is longer (never shorter: a window too
    short stops a healthy run, one too long only watches longer)."""
    seen = [*within_check, *(activity.per_step_seconds if activity else ())]
    if not seen:
        return None
    mean = activity.mean_step_seconds if activity else None
    return max(statistics.median(seen), mean or 0.0)
