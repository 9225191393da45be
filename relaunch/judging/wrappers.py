"""An exit code a wrapper recorded over its trainer's death: a launch command or a typed pipe whose status is not the
trainer's (`bash start.sh` whose trainer a signal ended, `python train.py | tee log` without pipefail after an uncaught
exception). What the log says after the run's last step line tells it. Pure."""

from __future__ import annotations

import re

from relaunch.judging.signatures import EXCEPTION_LINE, STEP_LINE, TQDM_PROGRESS
from relaunch.judging.snapshot import HealthSnapshot
from relaunch.judging.torchrun import RANK_PREFIX

# What a trainer (or its framework) prints as training ends: `training complete`, HF's `Training completed.`,
# Lightning's `` `Trainer.fit` stopped: `max_steps=100` reached.``.
TRAINING_ENDED = re.compile(
    r"(?i)\btraining (is )?(complete|completed|finished|done|ended)\b|\b(finished|done with|end of) training\b"
    r"|stopped: `?max_(steps|epochs)=\d+`? reached"
)


# bash's report of a foreground child ended by a signal, in a script that goes on and may exit 0 (`bash start.sh`, where
# start.sh runs `python train.py` then `echo done`): `start.sh: line 3:  9948 Killed    python -u train.py`, or a bare
# `Terminated` (tests/fixtures/logs/cpu/wrapped_sig*.log, captured).
SHELL_JOB_SIGNALED = re.compile(
    r"(?:^|: line \d+:\s+\d+ )(?P<signal>Killed|Terminated|Segmentation fault|Aborted|Bus error|Hangup|Quit|Illegal instruction"
    r"|Floating point exception|User defined signal [12])(?:\s+\(core dumped\))?(?:\s{2,}\S.*)?\s*$"
)
SIGNAL_EXIT_CODES = {
    "Hangup": 129, "Quit": 131, "Illegal instruction": 132, "Aborted": 134, "Bus error": 135, "Floating point exception": 136,
    "Killed": 137, "User defined signal 1": 138, "Segmentation fault": 139, "User defined signal 2": 140, "Terminated": 143,
}  # fmt: skip


def _after_last_step(lines: list[str]) -> list[str]:
    """The lines after the run's last step or progress line (all of them where it printed none)."""
    last_step = max((i for i, line in enumerate(lines) if STEP_LINE.search(line) or TQDM_PROGRESS.search(line)), default=-1)
    return lines[last_step + 1 :]


def signaled_in_script(snap: HealthSnapshot) -> tuple[int, str] | None:
    """(128 + signal, the shell's line) where a script's shell reported a child ended by a signal after the run's last
    step line, and the trainer never said it finished: the launch command's 0 is the script's, not the trainer's."""
    after = [line.strip() for line in _after_last_step(snap.log_tail)]
    if any(TRAINING_ENDED.search(line) for line in after):
        return None
    found = next((m for line in after if (m := SHELL_JOB_SIGNALED.search(line))), None)
    return (SIGNAL_EXIT_CODES[found["signal"]], found.string) if found else None


# Python's report of an exception nothing caught opens with this line at column 0 (torch's ranks prefix it `[rankN]: `).
TRACEBACK_HEADER = re.compile(r"^Traceback \(most recent call last\):\s*$")
# Reports of an exception that did not end the trainer's process: Python's for one it could not raise (a `__del__`'s),
# logging's for a handler that failed, threading's for a thread's (`Exception in thread uploader:`), multiprocessing's for
# a child process's (`Process exporter:`; cpu/background_*_traceback.log, exit 0). Their tracebacks follow them.
NOT_FATAL_REPORT = re.compile(r"^(?:Exception ignored in\b|--- Logging error ---|Exception in thread .+:$|Process .+:$)")
# What may follow an uncaught exception's closing line and still leave it the log's end: the traceback's own furniture
# (frames, quoted source, a chained exception, a multi-line message's indented lines and torch's closing advice in its
# messages: dynamo's `Set TORCHDYNAMO_VERBOSE=1 ...`, torch.load's `Check the documentation of torch.load ...`), the
# interpreter's and torchrun's shutdown lines (warnings, glog lines `W1206 03:43:16.151000 ...`, the ChildFailedError's
# failure table).
AFTER_UNCAUGHT = re.compile(
    r"^(?:\s|$)|^Traceback \(most recent call last\):|^During handling of the above exception|^The above exception was the direct cause"
    r"|^Set TORCHDYNAMO_VERBOSE=|^Check the documentation of torch\.load\b"
    r"|^\w*Warning\b|\w*Warning: |^\[?[IWEF]\d{4} \d\d:\d\d:\d\d|^Exception ignored in\b"
    r"|^(?:={20,}|-{20,}|Failures:|Root Cause \(first observed failure\):|<NO_OTHER_FAILURES>|\[\d+\]:|\S+ FAILED)\s*$"
)
# Other lines after the exception that still leave it at the log's end: a wrapper's own words (`echo "start.sh: training
# script ended"`), tee'd lines of the script. More than these and something carried on after it: not the log's end.
WRAPPER_LINES_AFTER = 3


def uncaught_at_end(lines: list[str]) -> str | None:
    """The closing line of an uncaught exception that ends the log: its traceback after the run's last step line, at
    most a wrapper's few lines after it, and no word that training finished. None where there is no such exception.

    Python exits 1 on an uncaught exception, so an exit code 0 recorded over it is not the trainer's but a wrapper's:
    `python train.py | tee log` without pipefail records tee's, a script its last command's."""
    after = [RANK_PREFIX.sub("", line.rstrip()) for line in _after_last_step(lines)]
    if any(TRAINING_ENDED.search(line) for line in after):
        return None
    headers = [
        i
        for i, line in enumerate(after)
        if TRACEBACK_HEADER.match(line) and not any(NOT_FATAL_REPORT.match(prev) for prev in after[max(0, i - 1) : i])
    ]
    if not headers:
        return None
    closing = next((i for i in range(headers[-1] + 1, len(after)) if EXCEPTION_LINE.match(after[i])), None)
    if closing is None:
        return None
    others = [line for line in after[closing + 1 :] if not AFTER_UNCAUGHT.search(line) and not EXCEPTION_LINE.match(line)]
    return after[closing].strip() if len(others) <= WRAPPER_LINES_AFTER else None
