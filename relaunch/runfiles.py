"""Pure builders of the per-run scripts the host executes, and the parser of a health poll."""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from relaunch import runlayout
from relaunch.config import Target
from relaunch.gpufaults import parse_gpu_health
from relaunch.logtext import clean_lines
from relaunch.snapshot import DiskFree, GpuApp, GpuSample, HealthSnapshot, JournalPoll, JournalStep, OpenWrite

N = TypeVar("N", int, float)

TAIL_BYTES = 256 * 1024
# Lines of the tail the diagnosis reads: enough for the step rate and the last traceback.
TAIL_LINES = 200


def utc_stamp(now: datetime | None = None) -> str:
    """Sortable, and unique enough for names made in one recovery (microseconds)."""
    return (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S.%fZ")


def new_run_id(attempt: int, now: datetime | None = None, stamp: str | None = None) -> str:
    return f"{stamp or utc_stamp(now)}-a{attempt}"


def run_dir(target: Target, run_id: str) -> str:
    return runlayout.run_folder(target.state_path, run_id)


def log_path(target: Target, run_id: str) -> str:
    return f"{target.log_dir}/{target.name}-{run_id}.log"


def trainer_env(target: Target) -> dict[str, str]:
    """What warm-up and trainer share, so the warmed kernels are the ones training looks up.

    PYTHONUNBUFFERED=1 unless the target sets it or says `unbuffered: false`: the trainer's stdout is a pipe to
    the log writer, so Python would buffer it in blocks, and step lines arriving in bursts read as a stall.

    TRITON_HOME inside the compile cache unless the target places Triton's cache itself: Triton builds its CUDA driver
    module (`cuda_utils*.so`) under $HOME/.triton/cache, not under TORCHINDUCTOR_CACHE_DIR, and that module cut short
    kills every start with SIGBUS (tests/fixtures/logs/gpu/cache_so_half.log). Inside the cache, moving the cache aside
    cures it, and one target's Triton build never serves another's.
    """
    env = {"TORCHINDUCTOR_CACHE_DIR": target.inductor_cache_dir, "VIRTUAL_ENV": target.venv_dir}
    if not {"TRITON_HOME", "TRITON_CACHE_DIR"} & target.env.keys():
        env["TRITON_HOME"] = f"{target.inductor_cache_dir}/triton_home"
    if target.unbuffered and "PYTHONUNBUFFERED" not in target.env:
        env["PYTHONUNBUFFERED"] = "1"
    return {**env, **target.env}


def trainer_spec(target: Target, command: str) -> list[str]:
    """What the supervisor reads from the run folder, NUL-separated: repo, venv bin, command, then KEY=VALUE entries."""
    return [target.repo_dir, f"{target.venv_dir}/bin", command, *(f"{k}={v}" for k, v in trainer_env(target).items())]


def trainer_command(target: Target, checkpoint: str | None) -> str:
    """launch_command, plus resume_arg with the checkpoint's path quoted once for the shell that runs it.

    With `resume_from: folder` {checkpoint} is checkpoint_dir itself (Megatron's --load reads the folder's
    tracker); relaunch still chose `checkpoint`, the one that loader will take, and records it.
    """
    if not checkpoint:
        return target.launch_command
    path = target.checkpoint_dir if target.resume_from == "folder" and target.checkpoint_dir else checkpoint
    # replace, not format(): resume_arg is validated to hold only {checkpoint}, and format() would also
    # read `{{` as an escape the user did not mean here.
    return f"{target.launch_command} {target.resume_arg.replace('{checkpoint}', shlex.quote(path))}"


def state_identity(target: Target) -> str:
    """Who owns a state folder (STATE/target, lib.sh claim_state): one line, the same for a launch, an adoption,
    a poll and a stop."""
    return f"{target.name} {target.repo_dir} {target.tmux_session}"


def new_nonce() -> str:
    return secrets.token_hex(8)


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
    )


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


def number_or_none(text: str | None, kind: Callable[[str], N]) -> N | None:
    """A host file's number (`kind` of it), or None where the file was empty, missing or half-written."""
    try:
        return kind(text) if text else None
    except ValueError:
        return None
