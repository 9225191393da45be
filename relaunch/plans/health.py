"""The host command of one health poll (relaunch/host/snapshot.sh); pure, no Prefect."""

from __future__ import annotations

import re

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.judging.hardware import parse_gpu_health
from relaunch.judging.logtext import FAILURE_WORDS, clean_lines, number_or_none
from relaunch.judging.snapshot import (
    DiskFree,
    GpuApp,
    GpuSample,
    GpuUse,
    HealthSnapshot,
    JournalPoll,
    JournalStep,
    LockWait,
    OpenWrite,
    ProcessSample,
    ProgressSample,
)
from relaunch.runlayout import state_identity
from relaunch.wire.commands import Command, script

# The log's tail a poll reads: its last TAIL_BYTES, and of those the last TAIL_LINES lines the diagnosis reads
# (enough for the step rate and the last traceback).
TAIL_BYTES = 256 * 1024
TAIL_LINES = 200
# What a line that may settle a start-up looks like, to the host's wait (grep -Ei): a step or iteration word, a rate,
# an epoch's bar. Only a hint of when to poll: a line it wakes on is judged by the diagnosis like any other.
PROGRESS_WORDS = r"step|iter|it/s|s/it|epoch|tok/s|tokens/s"


def plan_snapshot(
    target: Target,
    wait_seconds: float,
    nonce: str,
    tail_lines: int = TAIL_LINES,
    wake_on_log_write: bool = False,
    seen_step: tuple[float, int] | None = None,
    want_stacks: bool = False,
    wake_floor_seconds: float = 0.2,
    progress_wake_floor_seconds: float | None = None,
) -> Command:
    """One poll; the wait is sent in milliseconds so a fractional poll interval is honoured.

    With `wake_on_log_write` the wait also ends when the trainer's log is written, not before `wake_floor_seconds`
    (a log written many times a second makes at most one poll per floor), and not before `progress_wake_floor_seconds`
    where the lines written since the last poll look like progress (PROGRESS_WORDS): a start-up's first step line is read
    at once while its compile lines wake a poll once per floor. `seen_step` (host time, step):
    what the previous poll read in the log, journaled by this one (RUN/journal). `want_stacks`: py-spy dumps of the
    tree's Python processes come back too (a quiet log over a busy tree: computing, or waiting?)."""
    args = (target.state_path, target.tmux_session, str(int(wait_seconds * 1000)), str(tail_lines), "1", nonce)
    args += (target.venv_dir, target.inductor_cache_dir, str(TAIL_BYTES), FAILURE_WORDS, target.log_dir, target.checkpoint_dir or "")
    args += (str(max(1, int(wake_floor_seconds * 1000))) if wake_on_log_write else "0", state_identity(target))
    args += (f"{seen_step[0]:.6f} {seen_step[1]}" if seen_step else "", "1" if want_stacks else "0")
    args += (target.repo_dir, target.launch_command)
    progress = wake_on_log_write and progress_wake_floor_seconds is not None
    args += (str(max(1, int(progress_wake_floor_seconds * 1000))) if progress else "0", PROGRESS_WORDS)
    args += (f"{target.thresholds.progress_sample_seconds:g}",)
    return script(host_script("snapshot"), *args, label="health poll", timeout_seconds=wait_seconds + 60)


def plan_journal_step(target: Target, run_id: str, seen_step: tuple[float, int]) -> Command:
    """The step a check's last poll read (host time, step), journaled in RUN/journal of `run_id` if it is still current:
    the next check learns the step interval from it, even where every check settles at its first poll."""
    return script(
        host_script("journal_step"),
        target.state_path,
        run_id,
        f"{seen_step[0]:.6f} {seen_step[1]}",
        label="journal step",
        timeout_seconds=30,
    )


def parse_snapshot(stdout: str, host: str, nonce: str) -> HealthSnapshot:
    """Read the SNAPSHOT script's sections; lines before the first marker (shell noise) are ignored."""
    mark = f"@@relaunch-{nonce}@@ "
    fields: dict[str, str] = {}
    sections: dict[str, list[str]] = {
        "tail": [],
        "matches": [],
        "gpu": [],
        "gpu_health": [],
        "kernel": [],
        "disk": [],
        "tree": [],
        "foreign": [],
        "writing": [],
        "stacks": [],
        "journal": [],
        "strays": [],
        "survivors": [],
        "own_log_tail": [],
        "gpu_apps": [],
        "progress": [],
    }
    current: list[str] | None = None
    # Only \n separates the poll's own lines; a \r inside a log line is the log's business (clean_lines).
    for line in stdout.split("\n"):
        if line.startswith(mark):
            key, _, value = line[len(mark) :].partition(" ")
            current = sections.get(key)
            if current is None:
                fields[key] = value.strip()
        elif current is not None:
            current.append(line)
    tail_start = number_or_none(fields.get("tail_start"), int) or 0
    seen = {key for key in sections if any(line.startswith(f"{mark}{key}") for line in stdout.split("\n"))}
    journal, journal_steps = parse_journal(sections["journal"])
    tail = clean_lines("\n".join(sections["tail"]))
    if fields.get("tail_partial") == "1" and tail:
        tail = tail[1:]
    now = number_or_none(fields.get("now"), float)
    started, mtime = number_or_none(fields.get("started_at"), float), number_or_none(fields.get("log_mtime"), float)
    return HealthSnapshot(
        host=host,
        launched=fields.get("launched") == "1",
        run_id=fields.get("run_id") or None,
        session_alive=fields.get("session") == "1",
        pid=number_or_none(fields.get("pid"), int),
        pid_alive=fields.get("pid_alive") == "1",
        exit_code=number_or_none(fields.get("exit_code"), int),
        exit_masked=fields.get("exit_masked") or None,
        exit_at_epoch=number_or_none(fields.get("exit_at"), float),
        supervisor_alive=fields.get("supervisor_alive") == "1",
        repo_dir_missing=fields.get("repo_missing") or None,
        seconds_since_launch=(now - started) if now is not None and started is not None else None,
        seconds_since_log_write=max(0.0, now - mtime) if now is not None and mtime is not None else None,
        log_size_bytes=number_or_none(fields.get("log_size"), int) or 0,
        log_tail=tail[-TAIL_LINES:],
        log_matches=_before_tail(sections["matches"], tail_start),
        gpus=parse_gpu_csv("\n".join(sections["gpu"])),
        kernel_lines=sections["kernel"],
        gpu_query_error=_gpu_error(fields.get("gpu_rc"), sections["gpu"]),
        gpu_health=parse_gpu_health("\n".join(sections["gpu_health"])),
        kernel_readable=None if "kernel_readable" not in fields else fields["kernel_readable"] == "1",
        disks=parse_disks(sections["disk"]),
        log_mtime_epoch=mtime,
        checkpoint=fields.get("checkpoint") or None,
        launched_gpus=fields.get("launched_gpus") or None,
        unfinished_steps=fields.get("unfinished", "").split(),
        stopped_at=number_or_none(fields.get("stopped_at"), float),
        stopped_how=fields.get("stopped_how") or None,
        state_owner=fields.get("state_owner") or None,
        adopted=fields.get("adopted") == "1",
        tree_pids=[int(line) for line in sections["tree"] if line.strip().isdigit()],
        checkpoint_mtime_epoch=number_or_none(fields.get("checkpoint_mtime"), float),
        foreign=[line.strip() for line in sections["foreign"] if line.strip()],
        foreign_log=fields.get("foreign_log") or None,
        log_followed=fields.get("log_followed") or None,
        host_now_epoch=now,
        tree_cpu_ticks=number_or_none(fields.get("tree_cpu_ticks"), int),
        tree_wchar_bytes=number_or_none(fields.get("tree_wchar"), int),
        writing=parse_writing(sections["writing"]),
        stacks="\n".join(sections["stacks"]) if "stacks" in seen else None,
        journal=journal,
        journal_steps=journal_steps,
        strays=[line.strip() for line in sections["strays"] if line.strip()],
        survivors=[line.strip() for line in sections["survivors"] if line.strip()],
        own_log=fields.get("own_log") or None,
        gpu_apps=parse_gpu_apps(sections["gpu_apps"]),
        own_log_tail=clean_lines("\n".join(sections["own_log_tail"]))[-TAIL_LINES:],
        progress=parse_progress(sections["progress"]),
    )


def parse_progress(lines: list[str]) -> list[ProgressSample]:
    """RUN/progress (relaunch/host/recorder.sh): `@ EPOCH LOG_SIZE` opens a sample, `p`, `l`, `g` and `a` lines fill it;
    a torn line (the recorder cut mid-write, a trim) is skipped, and samples come out in time order."""
    samples: list[ProgressSample] = []
    for line in lines:
        f = line.split()
        try:
            if f[:1] == ["@"] and len(f) == 3:
                samples.append(ProgressSample(at_epoch=float(f[1]), log_size_bytes=int(f[2])))
            elif not samples:
                continue
            elif f[:1] == ["p"] and len(f) >= 6:
                comm = f[6] if len(f) > 6 else ""
                samples[-1].processes.append(
                    ProcessSample(pid=int(f[1]), state=f[2], cpu_ticks=int(f[3]), io_bytes=int(f[4]), wchan=f[5], comm=comm)
                )
            elif f[:1] == ["l"] and len(f) >= 3:
                samples[-1].lock_waits.append(LockWait(waiter_pid=int(f[1]), holder_pid=int(f[2]), holder_comm=" ".join(f[3:])))
            elif f[:1] == ["g"] and len(f) >= 4:
                bus = f[4] if len(f) > 4 else ""
                samples[-1].gpus.append(GpuUse(index=int(f[1]), utilization_percent=int(f[2]), memory_used_mib=int(f[3]), bus_id=bus))
            elif f[:1] == ["a"] and len(f) >= 3:
                samples[-1].gpu_apps.append(GpuApp(pid=int(f[1]), used_memory_mib=int(f[2])))
                if len(f) > 3:
                    samples[-1].gpu_app_buses[int(f[1])] = f[3]
        except ValueError:
            continue
    return sorted(samples, key=lambda s: s.at_epoch)


def parse_gpu_apps(lines: list[str]) -> list[GpuApp]:
    """`nvidia-smi --query-compute-apps=pid,...,used_memory` lines: the PID first, the memory last (`607, 8976` with
    nounits, `607, python3, 8976 MiB` without)."""
    apps = []
    for line in lines:
        fields = [part.strip() for part in line.split(",")]
        mem = fields[-1].removesuffix("MiB").strip()
        if len(fields) >= 2 and fields[0].isdigit() and mem.isdigit():
            apps.append(GpuApp(pid=int(fields[0]), used_memory_mib=int(mem)))
    return apps


def parse_writing(lines: list[str]) -> list[OpenWrite]:
    """`SIZE MTIME PATH` lines (snapshot.sh's tree_activity); a path may hold spaces."""
    out = []
    for line in lines:
        size, _, rest = line.partition(" ")
        mtime, _, path = rest.partition(" ")
        if size.isdigit() and (m := number_or_none(mtime, float)) is not None and path:
            out.append(OpenWrite(size_bytes=int(size), mtime_epoch=m, path=path))
    return out


def parse_journal(lines: list[str]) -> tuple[list[JournalPoll], list[JournalStep]]:
    """RUN/journal: `P NOW CPU LOG_SIZE WRITTEN WRITTEN_MTIME CKPT_MTIME` and `S HOSTTIME STEP` lines; a torn line is skipped."""
    polls: list[JournalPoll] = []
    steps: list[JournalStep] = []
    for line in lines:
        f = line.split()
        try:
            if f[:1] == ["P"] and len(f) == 7:
                ckpt = None if f[6] in ("-", "") else float(f[6])
                polls.append(
                    JournalPoll(
                        at_epoch=float(f[1]),
                        cpu_ticks=int(f[2]),
                        log_size_bytes=int(f[3]),
                        written_bytes=int(f[4]),
                        written_mtime_epoch=float(f[5]),
                        checkpoint_mtime_epoch=ckpt,
                    )
                )
            elif f[:1] == ["S"] and len(f) == 3:
                steps.append(JournalStep(at_epoch=float(f[1]), step=int(f[2])))
        except ValueError:
            continue
    # The host sends the lines where the step changed ahead of the journal's tail (and keeps them when it trims): the
    # same line may come twice; in time order, once each.
    unique = {(s.at_epoch, s.step): s for s in steps}
    return polls, sorted(unique.values(), key=lambda s: s.at_epoch)


OFFSET = re.compile(r"^(\d+)[:-](.*)$", re.DOTALL)


def _before_tail(lines: list[str], tail_start: int) -> list[str]:
    """grep -b -B output, in log order, without the lines the tail already holds."""
    kept: dict[int, str] = {}
    for line in lines:
        m = OFFSET.match(line)
        if m and int(m[1]) < tail_start:
            kept[int(m[1])] = m[2]
    return clean_lines("\n".join(kept[n] for n in sorted(kept)))


def _gpu_error(rc: str | None, lines: list[str]) -> str | None:
    if rc in (None, "", "0"):
        return None
    text = " ".join(line.strip() for line in lines if line.strip())[:500]
    return f"nvidia-smi exited {rc}: {text or '(no output)'}"


def parse_disks(lines: list[str]) -> list[DiskFree]:
    """`AVAIL_KB SIZE_KB PATH` lines (the path last: it may hold spaces)."""
    out = []
    for line in lines:
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
            out.append(DiskFree(path=parts[2], available_bytes=int(parts[0]) * 1024, size_bytes=int(parts[1]) * 1024))
    return out


GPU_LINE = re.compile(r"^\s*(\d+),\s*(\d+)(?:\s*MiB)?,\s*(\d+)(?:\s*%)?\s*$")


def parse_gpu_csv(text: str) -> list[GpuSample]:
    """`index, memory.used, utilization.gpu` rows, with or without units."""
    out = []
    for line in text.splitlines():
        m = GPU_LINE.match(line)
        if m:
            out.append(GpuSample(index=int(m[1]), memory_used_mib=int(m[2]), utilization_percent=int(m[3])))
    return out
