"""`relaunch logs`: the current attempt's log from the host, by byte offsets, over the same transport as every step.

Following is a poll of new bytes once a second, one round trip each: it works the same through SSH and a
container, and needs no long-lived channel.
"""

from __future__ import annotations

import time
from typing import TextIO

from relaunch.config import Target
from relaunch.errors import RelaunchError
from relaunch.host import host_script
from relaunch.wire.commands import script
from relaunch.wire.transport import run, transport_for

LOG_PATH = host_script("log_path")

# The log's size, then its bytes from OFFSET (at most MAX of them).
CHUNK = host_script("log_chunk")

# The log's size, then its last N lines as of that size (a growing log adds nothing to this answer).
TAIL = host_script("log_tail")

CHUNK_BYTES = 1 << 20
FOLLOW_INTERVAL_SECONDS = 1.0


def log_path_of(target: Target) -> str:
    out = run(
        transport_for(target.host),
        script(LOG_PATH, target.state_path, label="find the current log"),
        advice="nothing was launched by relaunch for this target yet",
    ).stdout
    return out.strip().splitlines()[-1]


def read_from(target: Target, path: str, offset: int) -> tuple[int, str]:
    """(log size, the text from offset on, at most CHUNK_BYTES of it)."""
    out = run(
        transport_for(target.host),
        script(CHUNK, path, str(offset), str(CHUNK_BYTES), label="read the log"),
        advice="the log is gone or unreadable",
    ).stdout
    head, _, text = out.partition("\n")
    if not head.strip().isdigit():
        raise RelaunchError(f"on {target.host.label}: unexpected answer reading {path}: {head[:200]!r}")
    return int(head), text


def tail_lines(target: Target, path: str, lines: int, out: TextIO) -> int:
    """Print the last `lines` lines; return the byte offset they end at, where following starts."""
    answer = run(
        transport_for(target.host), script(TAIL, path, str(lines), label="read the log's tail"), advice="the log is gone or unreadable"
    ).stdout
    head, _, text = answer.partition("\n")
    out.write(text)
    out.flush()
    return int(head)


def follow_log(target: Target, path: str, offset: int, out: TextIO) -> None:
    while True:
        size, text = read_from(target, path, offset)
        if size < offset:  # truncated or replaced: start again from its beginning
            offset = 0
            continue
        if text:
            out.write(text)
            out.flush()
            offset += len(text.encode())
        else:
            time.sleep(FOLLOW_INTERVAL_SECONDS)
