"""A run whose trainer is gone: why it died, its own failure before its peers' knock-on, from its exit, its log and the kernel's. Pure."""

from __future__ import annotations

import re
from datetime import datetime

from relaunch.judging.findings import Diagnosis, Metrics, last_log_lines, own_lines, run_pids
from relaunch.judging.hardware import disk_full_evidence, free_space_now, full_disk_evidence
from relaunch.judging.signatures import (
    CACHE_DAMAGE_WARNING,
    DATALOADER_WORKER_DIED,
    EXCEPTION_LINE,
    KERNEL_OOM,
    LOAD_ERROR_DETAIL,
    MODULE_TO_PACKAGE,
    NATIVE_SIGNALS,
    OUTSIDE_SIGNALS,
    PEER_LOST,
    PICKLED_NAME_GONE,
    REFINEMENTS,
    SHORT_WRITE,
    SIGNAL_NAMES,
    SIGNATURES,
    WRAPPER_EXCEPTIONS,
)
from relaunch.judging.snapshot import HealthSnapshot
from relaunch.judging.torchrun import (
    RankFailure,
    barrier_absentees,
    collective_timeouts,
    failed_ranks,
    rank_lines,
    rendezvous_gap,
    root_cause,
    worker_group_failures,
)
from relaunch.judging.wrappers import TRAINING_ENDED, signaled_in_script, uncaught_at_end
from relaunch.vocabulary import Cause, Verdict


def stray_name(line: str) -> str:
    """`123 program python train.py` as a person reads it: `python train.py` (pid 123, runs train.py in repo_dir)."""
    pid, _, rest = line.strip().partition(" ")
    how, _, command = rest.partition(" ")
    found = "carries this target's marker" if how == "marker" else "runs the launch command's program in repo_dir"
    return f"`{command.strip()}` (pid {pid}, {found})"


def kernel_note(snap: HealthSnapshot) -> list[str]:
    return (
        ["the kernel log is not readable here (a container?): judged from nvidia-smi and the trainer's own lines"]
        if snap.kernel_readable is False
        else []
    )


def judge_gone(snap: HealthSnapshot, metrics: Metrics, min_free_disk_gb: float = 0.0) -> Diagnosis:
    code = snap.exit_code
    if code in (0, None) and (signaled := signaled_in_script(snap)) is not None:
        # The trainer was ended by a signal; its script went on and exited 0 (or its end was not recorded: a child of
        # the trainer outlived the script a moment). Judged as the signal's death, not finished, not silent.
        gone = judge_gone(snap.model_copy(update={"exit_code": signaled[0]}), metrics, min_free_disk_gb)
        exited = "exited 0" if code == 0 else "left no exit code"
        said = f"the launch command {exited}, but its script's shell reported its program ended by a signal: {signaled[1]}"
        return gone.model_copy(update={"evidence": [*gone.evidence, said]})
    if code == 0 and snap.exit_masked and not any(TRAINING_ENDED.search(line) for line in last_log_lines(snap, 6)):
        # The 0 is a wrapper script's pipeline's (tee's), not the trainer's, and the trainer never said it finished:
        # judged as a death without an exit code (its log's failure, else silent_exit), the wrapper named.
        gone = judge_gone(snap.model_copy(update={"exit_code": None, "exit_masked": None}), metrics, min_free_disk_gb)
        return gone.model_copy(update={"evidence": [*gone.evidence, f"the launch command exited 0, but {snap.exit_masked}"]})
    if code == 0 and snap.survivors:
        # Exit 0 while processes of this very run live on: the launch command put its trainer in the background (or a
        # daemon of it outlives it). Not finished, and no second trainer beside it: a person decides.
        return Diagnosis(
            verdict=Verdict.UNMANAGED,
            summary=f"the launch command exited 0 but its run lives on ({stray_name(snap.survivors[0])}): nothing stopped or launched",
            evidence=[
                *[f"alive, of this run: {stray_name(line)}" for line in snap.survivors],
                "a launch command that backgrounds its trainer (`&`, nohup, a daemon) leaves relaunch no exit to judge: "
                "launch the trainer in the foreground; until then end it yourself and `relaunch recover TARGET`",
                *last_log_lines(snap, 2),
            ],
            metrics=metrics,
        )
    if code == 0 and (uncaught := uncaught_at_end(snap.log_tail)) is not None:
        # Python exits 1 on an uncaught exception: a 0 over one that ends the log is a wrapper's (a pipe's tee without
        # pipefail, a script's last line), which no process of the run told the supervisor. Judged as a death without an
        # exit code (the log's failure), and the 0 named as the wrapper's.
        gone = judge_gone(snap.model_copy(update={"exit_code": None}), metrics, min_free_disk_gb)
        wrapper = (
            "exit code 0 recorded, but it is a wrapper's, not the trainer's (`| tee` without pipefail records tee's 0, a "
            f"script its last command's): the log ends in an uncaught exception after its last step ({uncaught}), and Python "
            "exits 1 on one"
        )
        unknown = _exit_text(snap.model_copy(update={"exit_code": None}))
        evidence = [line for line in gone.evidence if line != unknown]
        return gone.model_copy(update={"evidence": [*evidence, wrapper]})
    if code == 0:
        return Diagnosis(verdict=Verdict.FINISHED, summary="the trainer exited 0", evidence=last_log_lines(snap, 3), metrics=metrics)
    cause = classify_failure([*snap.log_matches, *snap.log_tail])
    # A DataLoader worker the trainer says died of a signal is of its tree even where no poll saw it (it lived seconds).
    workers = (
        {int(pid) for line in cause[2] if (m := DATALOADER_WORKER_DIED.search(line)) for pid in re.findall(r"\d+", m["pids"])}
        if cause
        else set()
    )
    oom_kernel = _kernel_oom_lines(snap, workers)
    if not oom_kernel and code == 137 and not workers and not run_pids(snap):
        # A saved log names no PID: an OOM kill of a process named like the trainer, with the exit code of a SIGKILL.
        oom_kernel = _unnamed_oom_lines(snap)
    exit_text = _exit_text(snap)
    if cause is not None and cause[0] in (Cause.BROKEN_CHECKPOINT, Cause.CHECKPOINT_INCOMPATIBLE) and metrics.steps_seen:
        # It stepped, so the checkpoint it was given loaded: the load error is about something else.
        cause = (Cause.ERROR, None, cause[2])
    if code is not None and code - 128 in OUTSIDE_SIGNALS and not oom_kernel:
        # A signal from outside ended it, whatever it printed as it went (Ctrl-C's KeyboardInterrupt traceback).
        name = SIGNAL_NAMES[code - 128]
        printed = [f"it printed as it went: {line}" for line in cause[2][-1:]] if cause else last_log_lines(snap, 2)
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=Cause.KILLED,
            summary=f"killed by {name}",
            evidence=[*printed, f"{exit_text} ({name})", *_outside_note(code - 128), *_others_oom(snap)],
            metrics=metrics,
        )
    rank = root_cause(snap.log_tail)
    # The rank torchrun saw fail first died of a signal while the log's first failure only says a peer was lost: that
    # rank is the cause (an abort after a lost collective is the collective's, gpu/nccl_watchdog_timeout.log).
    lost = cause is not None and _knock_on(cause) and rank is not None and rank.signal_number not in (None, 6)
    if rank and (cause is None or (cause[0] is Cause.ERROR and WRAPPER_EXCEPTIONS.search(cause[2][-1])) or lost):
        # torchrun's wrapper error says nothing; the rank that failed first does.
        peers = [f"its peers only lost it: {cause[2][0]}"] if lost and cause else []
        return _rank_failure(rank, snap, metrics, exit_text, peers)
    if cause is not None and not (oom_kernel and (cause[0] is Cause.ERROR or workers)):
        kind, package, decisive = cause
        gap = None
        summary = f"{kind.value}: {decisive[-1].strip()}" if decisive else kind.value
        lines = [*snap.log_matches, *snap.log_tail]
        if kind is Cause.DISTRIBUTED_FAILURE:
            gap = rendezvous_gap(lines)
            restarts = worker_group_failures(lines)
            # A monitored barrier names the ranks that never reached it: the failure is theirs, not the reporter's.
            absent = barrier_absentees(lines)
            decisive = [*([absent] if absent else []), *decisive, *collective_timeouts(lines)]
            reported = "the rank that reported the barrier's timeout (torchrun's root cause), not its cause"
            decisive += [rank.describe(reported) if absent else rank.describe()] if rank else []
            decisive += [gap] if gap else []
            if len(restarts) > 1:
                # torchrun's group failed, restarted, and failed again: each failure is evidence of the restarts spent.
                decisive += restarts
                summary = f"torchrun restarted its worker group {len(restarts) - 1} time(s) and it failed again: {summary}"
            summary = gap or absent or summary
        if kind is Cause.KILLED:
            decisive = [*decisive, *_outside_note(_signal_said(decisive))]
        aborted = code == 134 or (rank is not None and rank.signal_number == 6)
        if kind is Cause.DISTRIBUTED_FAILURE and aborted:
            decisive.append("the SIGABRT that followed is this error's: nothing caught it, and C++'s terminate aborts the process")
        if kind is Cause.CHECKPOINT_INCOMPATIBLE:
            # What did not fit, as torch says it: the refused global, the missing keys, the first shape mismatch.
            detail = [line.strip() for line in lines if LOAD_ERROR_DETAIL.match(line)][:3]
            decisive += detail
            # An unpickler that cannot find a module or class the file names: the code moved it, the file is intact.
            gone_name = next((m for line in decisive if (m := PICKLED_NAME_GONE.search(line))), None)
            decisive += [_moved_note(gone_name)] if gone_name else []
            summary = f"{kind.value}: {detail[0]}" if detail else summary
        if package:
            summary = f"missing_dependency: install {package}"
        extra = (
            _checkpoint_note(snap)
            if kind in (Cause.BROKEN_CHECKPOINT, Cause.CHECKPOINT_INCOMPATIBLE)
            else _shm_note(snap)
            if kind in (Cause.NATIVE_CRASH, Cause.DISK_FULL)
            else []
        )
        extra += kernel_note(snap) if kind is Cause.GPU_FAULT else []
        # A full /dev/shm does not empty itself on a relaunch: a person must give the container more.
        shm_full = kind is Cause.DISK_FULL and any("shared memory" in line for line in decisive)
        # The trainer said its disk filled: the poll's figures say whether it still is (no relaunch onto it): below the
        # target's minimum, or really full (a write fails there now) where no minimum is set.
        low = (disk_full_evidence(snap, min_free_disk_gb) or full_disk_evidence(snap)) if kind is Cause.DISK_FULL else []
        if kind is Cause.DISK_FULL:
            decisive += [_short_write_note(m) for line in decisive[:2] if (m := SHORT_WRITE.search(line))][:1]
            decisive += [] if low else free_space_now(snap)
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=kind,
            package=package,
            summary=low[0] if low else summary,
            evidence=[*low, *decisive, *extra, exit_text],
            metrics=metrics,
            checkpoint=snap.checkpoint,
            disk_still_full=shm_full or bool(low),
            rendezvous_incomplete=gap is not None,
        )
    if oom_kernel or (code == 137 and any("Killed" == line.strip() for line in snap.log_tail[-3:])):
        said = cause[2] if cause and workers else []  # the trainer's own word that its worker died
        evidence = [*oom_kernel, *said, exit_text] if oom_kernel else [*last_log_lines(snap, 2), exit_text]
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=Cause.HOST_OOM_KILLED,
            summary="killed by the kernel's OOM killer",
            evidence=evidence,
            metrics=metrics,
        )
    if code is not None and code - 128 in NATIVE_SIGNALS:
        name = SIGNAL_NAMES[code - 128]
        damaged = [line.strip() for line in [*snap.log_matches, *snap.log_tail] if CACHE_DAMAGE_WARNING.search(line)][:1]
        if damaged and not metrics.steps_seen:
            # Inductor found its cache damaged, then the process died of its own signal before a step: loading that cache.
            evidence = [*damaged, f"{exit_text} ({name}) before the first step, after the compile cache was found damaged"]
            summary = f"died of {name} loading a damaged compile cache"
            return Diagnosis(verdict=Verdict.CRASHED, cause=Cause.CORRUPT_CACHE, summary=summary, evidence=evidence, metrics=metrics)
        evidence = [*last_log_lines(snap, 2), *_shm_note(snap), f"{exit_text} ({name}, raised by the trainer's own native code)"]
        return Diagnosis(verdict=Verdict.CRASHED, cause=Cause.NATIVE_CRASH, summary=f"died of {name}", evidence=evidence, metrics=metrics)
    if code is not None and code > 128:
        # A signal from outside (SIGKILL, SIGTERM) explains the death whatever the disk's free space.
        name = SIGNAL_NAMES.get(code - 128, f"signal {code - 128}")
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=Cause.KILLED,
            summary=f"killed by {name}",
            evidence=[*last_log_lines(snap, 2), f"{exit_text} ({name})", *_others_oom(snap)],
            metrics=metrics,
        )
    full = full_disk_evidence(snap)
    if full:
        # Nothing else explains the death and the disk is really full: the trainer's own words (a traceback, its
        # exit code) may be what could not be written.
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=Cause.DISK_FULL,
            summary=full[0],
            evidence=[*full, "the trainer's log names no other cause of its death", exit_text, *last_log_lines(snap, 2)],
            metrics=metrics,
            disk_still_full=True,
        )
    if code is None:
        evidence = [_session_line(snap), "trainer PID not alive", exit_text, *last_log_lines(snap, 2), *_others_oom(snap)]
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=Cause.SILENT_EXIT,
            summary="the trainer vanished without an exit code or traceback",
            evidence=evidence,
            metrics=metrics,
        )
    tail = last_log_lines(snap, 3)
    # The trainer's own last words first (a usage error's `error:` line follows its `usage:` line), then relaunch's
    # bookkeeping around them (its start banner, its exit record): a banner is never the line a person reads first.
    own = own_lines(tail)
    said = own[-1:] + own[:-1]
    refused = _refused_command(code, metrics, said)
    return Diagnosis(
        verdict=Verdict.CRASHED,
        cause=Cause.ERROR,
        summary=f"exited {code}: {said[0].strip()}" if refused else f"exited {code} without a traceback",
        evidence=[*said, *(line for line in tail if line not in own), exit_text],
        metrics=metrics,
        no_step_fixes=refused,
    )


# Exit status 2 is the command line's own refusal: Python's for a script it cannot open, argparse's (and most CLIs')
# for a usage error. Before a single step, with nothing else said, no step relaunch runs changes the command line.
USAGE_EXIT = 2


def _refused_command(code: int, metrics: Metrics, said: list[str]) -> str | None:
    if code != USAGE_EXIT or metrics.steps_seen or not said:
        return None
    return (
        "the launch command was refused as given (exit 2, before any step: a script or file it names is missing, or "
        "arguments the program does not accept); no recovery step changes the command line"
    )


def _rank_failure(rank: RankFailure, snap: HealthSnapshot, metrics: Metrics, exit_text: str, peers: list[str] | None = None) -> Diagnosis:
    signal = rank.signal_number
    cause = Cause.NATIVE_CRASH if signal in NATIVE_SIGNALS else Cause.KILLED if signal else Cause.ERROR
    summary = rank.describe()
    failures = worker_group_failures([*snap.log_matches, *snap.log_tail])
    if len(failures) > 1:
        # torchrun restarted its worker group and lost a rank again: the group cannot hold together; all ranks are
        # relaunched as one (the restarts torchrun allows are spent).
        summary = f"torchrun restarted its worker group {len(failures) - 1} time(s) and it failed again: {summary}"
        return Diagnosis(
            verdict=Verdict.CRASHED,
            cause=Cause.DISTRIBUTED_FAILURE,
            summary=summary,
            evidence=[summary, *failures, f"launcher: {exit_text}"],
            metrics=metrics,
        )
    note = _outside_note(signal) if signal in OUTSIDE_SIGNALS else []
    return Diagnosis(
        verdict=Verdict.CRASHED,
        cause=cause,
        summary=summary,
        evidence=[summary, f"launcher: {exit_text}", *note, *(peers or [])],
        metrics=metrics,
    )


def _exit_text(snap: HealthSnapshot) -> str:
    code = snap.exit_code
    if code is not None:
        return f"exit code {code}"
    if snap.adopted:
        return "no exit code: an adopted run's exit code cannot be known (relaunch did not start it)"
    return "no exit code recorded"


def _moved_note(m: re.Match[str]) -> str:
    what = f"`{m['module']}`" if m["module"] else f"`{m['cls']}` in `{m['in']}`"
    return (
        f"the checkpoint pickled an object of {what}, which the code now running no longer has where the code that wrote "
        "it had it (a refactor moved or renamed it): the checkpoint is intact; restore the code that wrote it"
    )


def _short_write_note(m: re.Match[str]) -> str:
    return f"a short write: {m['written']} of {m['requested']} items written (numpy's tofile/save): the filesystem it wrote to filled"


OUTSIDE_NOTES = {
    2: "SIGINT is what Ctrl-C sends: a person may have meant to stop it (`relaunch stop` keeps a run stopped)",
    1: "SIGHUP: the terminal or SSH session that started it closed (a run outside tmux or nohup)",
    15: "SIGTERM: a scheduler's preemption, a shutdown or a person",
}


def _outside_note(signal: int | None) -> list[str]:
    return [OUTSIDE_NOTES[signal]] if signal in OUTSIDE_NOTES else []


def _signal_said(lines: list[str]) -> int | None:
    """The outside signal a KILLED cause's lines name: Python's KeyboardInterrupt (SIGINT), torchrun's `got signal: N`."""
    for line in lines:
        if line.strip() == "KeyboardInterrupt":
            return 2
        if m := re.search(r"got signal: (\d+)", line):
            return int(m[1])
    return None


def _checkpoint_note(snap: HealthSnapshot) -> list[str]:
    return [f"the checkpoint it was given: {snap.checkpoint}"] if snap.checkpoint else []


SMALL_SHM_BYTES = 1 << 30


def _shm_note(snap: HealthSnapshot) -> list[str]:
    shm = next((d for d in snap.disks if d.path == "/dev/shm"), None)
    if shm and shm.size_bytes < SMALL_SHM_BYTES:
        return [
            f"/dev/shm is only {shm.size_bytes / 2**20:.0f} MiB ({shm.available_bytes / 2**20:.0f} MiB free): DataLoader workers pass batches through it (docker: --shm-size)"
        ]
    return []


Failure = tuple[Cause, str | None, list[str]]


# C++'s last words for an exception nothing caught; its message is on the `what():` line under it.
CXX_TERMINATE = re.compile(r"terminate called after throwing an instance of '")


def classify_failure(lines: list[str]) -> Failure | None:
    """The first failure in time: (cause, package to install, decisive lines), or None.

    In a log of several ranks the root cause is a rank that failed by itself, not its peers' knock-on: where the first
    failure is a lost peer or collective (PEER_LOST) or only a launcher's wrapper, a rank's own failure (its exception,
    read from its `[rankN]:` lines; a native signal in torchrun's failure table) is the cause, whatever the order of the
    ranks' lines; torchrun's root cause decides between several, the earliest otherwise."""
    first = _first_failure(lines)
    if _own(first) is not None:
        return first
    return _own_rank_failure(lines, first) or first


def _knock_on(failure: Failure) -> bool:
    """A distributed failure that only says a peer was lost (its socket closed, its collective timed out)."""
    return failure[0] is Cause.DISTRIBUTED_FAILURE and any(PEER_LOST.search(line) for line in failure[2])


def _own(found: Failure | None) -> Failure | None:
    """`found` where it is a failure of its own: neither a lost peer (a knock-on) nor only a launcher's wrapper."""
    return None if found is None or _knock_on(found) or WRAPPER_EXCEPTIONS.search(found[2][-1]) else found


def _own_rank_failure(lines: list[str], first: Failure | None) -> Failure | None:
    """The failure of a rank that failed by itself, beside ranks that only lost it; None where no rank did."""
    root, table = root_cause(lines), failed_ranks(lines)
    # (rank, where in the log, its failure); rank None: a failure in lines no rank prefixed, whose rank is not known
    own: list[tuple[int | None, int, Failure]] = []
    ranks = rank_lines(lines)
    for rank, numbered in ranks.items():
        found = _own(_first_failure([line for _, line in numbered]))
        if found is None:
            continue
        at = next((i for i, line in numbered if line.rstrip() == found[2][0]), numbered[0][0])
        own.append((rank, at, (found[0], found[1], [f"[rank{rank}]: {line}" for line in found[2]])))
    # A rank that died of its own native signal prints nothing; torchrun's table says it. An abort after a distributed
    # error is that error's consequence (C++'s terminate), not a rank's own crash.
    distributed = first is not None and first[0] is Cause.DISTRIBUTED_FAILURE
    aborted = [failure.rank for failure in table if failure.signal_number == 6]
    for failure in table:
        signal = failure.signal_number
        if signal in NATIVE_SIGNALS and not (signal == 6 and distributed) and failure.rank not in {r for r, _, _ in own}:
            own.append((failure.rank, len(lines), (Cause.NATIVE_CRASH, None, [failure.describe("its own native signal")])))
    if ranks or table:
        # A log of several ranks: C++'s terminate writes a rank's last words with no `[rankN]:` (the runtime's, not torch's
        # logging), so a rank's own uncaught error can sit in the unprefixed lines, wherever its peers' knock-on landed.
        # It is the aborted rank's, where torchrun names one rank that aborted.
        terminated = ((i, _own(_first_failure(lines[i:]))) for i, line in enumerate(lines) if CXX_TERMINATE.match(line))
        at, found = next(((i, f) for i, f in terminated if f and CXX_TERMINATE.match(f[2][0])), (len(lines), None))
        if found is not None:
            owner = aborted[0] if len(aborted) == 1 and found[0] is Cause.DISTRIBUTED_FAILURE else None
            own = [o for o in own if owner is None or o[0] != owner]
            own.append((owner, at, found))
    if not own:
        return None
    rank, _, (cause, package, decisive) = min(own, key=lambda o: (not (root and root.rank == o[0]), o[1]))
    named = (
        " (torchrun's root cause)"
        if root and root.rank == rank
        else f" (torchrun named rank {root.rank}, the first it saw exit)"
        if root
        else ""
    )
    who = f"rank {rank}" if rank is not None else "a rank"
    if first is not None and _knock_on(first):
        note = f"{who} failed by itself{named}; its peers only lost it: {first[2][0]}"
    elif first is not None:
        note = f"{who} failed by itself{named}: its own error, which {first[2][-1].strip()} only carries"
    else:
        note = f"{who} failed by itself{named}"
    return cause, package, [note, *decisive]


# site.py, for a .pth line that raised: this line, the indented traceback, then `Remainder of file ignored`.
PTH_ERROR = re.compile(r"^Error processing line \d+ of .*\.pth:$")


def _first_failure(lines: list[str]) -> Failure | None:
    """The first failure in time, line by line (SIGNATURES, then a traceback's closing exception line)."""
    fallback: Failure | None = None
    unraisable = skipped_pth = False
    for index, line in enumerate(lines):
        stripped = line.rstrip()
        if PTH_ERROR.match(stripped):
            # site.py's report of a .pth line it could not run, then skipped: the interpreter went on, never its death.
            skipped_pth = True
            continue
        if skipped_pth:
            skipped_pth = stripped != "Remainder of file ignored" and (not stripped or stripped[0].isspace())
            if skipped_pth or stripped == "Remainder of file ignored":
                continue
        if stripped.startswith("Exception ignored in"):
            # Python's report of an exception it could not raise (a __del__'s, gpu/cache_fxgraph_half.log): never fatal.
            unraisable = True
            continue
        if unraisable:
            unraisable = not EXCEPTION_LINE.match(stripped)
            continue
        if _is_warning(stripped) or _is_source_line(stripped):
            continue
        for cause, pattern in SIGNATURES:
            if cause is Cause.MISSING_DEPENDENCY:
                package = missing_package(stripped)
                if package:
                    return cause, package, [stripped]
            elif pattern.search(stripped):
                narrower, because = _refined(cause, lines, index)
                # C++'s terminate: its `what():` line is the message (the next Python exception line is another's).
                what = CXX_TERMINATE.match(stripped) and _what_line(lines, index)
                decisive = [stripped, what] if what else _with_exception_line(lines, index)
                return narrower, None, decisive + ([because.strip()] if because and because.strip() not in decisive else [])
        if EXCEPTION_LINE.match(stripped):
            if not WRAPPER_EXCEPTIONS.search(stripped):
                return Cause.ERROR, None, [stripped]
            # A launcher re-raising a worker's failure: the worker's own error, printed below, is the cause.
            fallback = fallback or (Cause.ERROR, None, [stripped])
    return fallback


# How far below C++'s terminate line its `what():` may come: the process writes the two lines apart, and other ranks'
# and torchrun's lines sharing the log can land between them.
WHAT_WITHIN_LINES = 40


def _what_line(lines: list[str], index: int) -> str | None:
    """The `what():` line of the terminate at `index`: the first below it, before the next terminate."""
    for line in lines[index + 1 : index + 1 + WHAT_WITHIN_LINES]:
        if line.lstrip().startswith("what():"):
            return line.strip()
        if CXX_TERMINATE.match(line):
            return None
    return None


def missing_package(line: str) -> str | None:
    """The distribution to install, when the line reports a missing dependency."""
    if not (EXCEPTION_LINE.match(line) or line.lstrip().startswith(("ModuleNotFoundError", "ImportError"))):
        return None
    m = re.search(r"No module named '([\w.]+)'", line)
    if m and ("ModuleNotFoundError" in line or "ImportError" in line):
        module = m.group(1)
        top = module.split(".")[0]
        return MODULE_TO_PACKAGE.get(module) or MODULE_TO_PACKAGE.get(top) or top.replace("_", "-")
    m = re.search(r"pip install (?:-U |--upgrade )?[`'\"]?([A-Za-z0-9][A-Za-z0-9_.\-\[\]]*(?:[=<>!~]=?[\w.*]+)?)", line)
    if m:
        return m.group(1).rstrip(".")
    return None


def _is_source_line(line: str) -> bool:
    """Source quoted in a traceback (`    raise InductorError(...)`) names errors without being one."""
    return line[:1].isspace() and not line.lstrip().startswith(('File "', "ModuleNotFoundError", "ImportError"))


def _is_warning(line: str) -> bool:
    """Warnings print before failures and cause none (`destroy_process_group() was not called`)."""
    # glog's warning prefix, bracketed (`[W1202 12:45:42.685 ...]`, c10d) or not (`W1202 12:45:42.685000 3362 file.py:1716]`,
    # torch's Python logging: inductor's fx graph cache unable to load a damaged entry, cpu/compile_cache_truncated.log).
    return bool(
        re.match(r"^\w*Warning\b", line)
        or re.search(r"\bWarning: |UserWarning: |^(\[rank\d+\]:)?\[W\d{4} |^(\[rank\d+\]:)?W\d{4} \d\d:\d\d:\d\d\.\d+ ", line)
    )


def _with_exception_line(lines: list[str], index: int) -> list[str]:
    """The matching line, plus the traceback's closing exception line when it follows."""
    decisive = [lines[index].rstrip()]
    closing = _closing_line(lines, index)
    if closing is not None and lines[closing].rstrip() not in decisive:
        decisive.append(lines[closing].rstrip())
    return decisive


def _closing_line(lines: list[str], index: int) -> int | None:
    """The index of the traceback's closing exception line at or after index, within 300 lines."""
    return next((i for i in range(index, min(len(lines), index + 300)) if EXCEPTION_LINE.match(lines[i].rstrip())), None)


def _refined(cause: Cause, lines: list[str], index: int) -> tuple[Cause, str | None]:
    """The narrower cause the traceback's own message names (REFINEMENTS), and the line that names it: a frame in
    torch.load that ends in `Weights only load failed`, a BackendCompilerFailed that chains a cached module's import failure."""
    closing = _closing_line(lines, index)
    # The message: from the matching line to the closing line and the chained lines after it, up to a blank line; with no
    # closing line (faulthandler's dump), what follows within the scan's reach.
    end = index + 300 if closing is None else closing + 1
    while closing is not None and end < len(lines) and end <= closing + 4 and lines[end].strip():
        end += 1
    # The innermost frame above the matching line: where the failure was raised (a traceback's last `File` line).
    frame = next((lines[i] for i in range(index - 1, max(-1, index - 40), -1) if lines[i].lstrip().startswith('File "')), None)
    message = [*([frame] if frame else []), *lines[index:end]]
    for narrower, pattern in REFINEMENTS.get(cause, []):
        found = next((line for line in message if pattern.search(line)), None)
        if found is not None:
            return narrower, found
    return cause, None


def _kernel_oom_lines(snap: HealthSnapshot, also: set[int] | None = None) -> list[str]:
    """OOM-kill lines naming the run's own processes: its recorded PID, any PID seen in its tree (DataLoader
    workers, torchrun's ranks), or `also` (workers the trainer named). A host's kernel log holds other jobs' kills too."""
    ours = run_pids(snap) | (also or set())
    return [line.strip() for line in snap.kernel_lines if _oom_pid(line) in ours][:3]


# The names a trainer's processes have in the kernel's report (its `comm`): the interpreter, torch's own threads and
# workers (`pt_main_thread`, `pt_data_worker`, torchrun's `pt_elastic`), the launchers.
TRAINER_PROCESS = re.compile(r"^(?:python[\d.]*|pt_\w+|torchrun|deepspeed|accelerate|lightning)$")


KILLED_NAME = re.compile(r"Killed process \d+ \((?P<name>[^)]+)\)|\btask=(?P<task>[^,]+),pid=")


# dmesg --time-format iso, journalctl -k -o short-iso: `2026-12-02T21:59:14,545642+00:00 ...` (a wall clock; plain dmesg
# prints seconds since boot, which no run's start can be compared with).
KERNEL_ISO_TIME = re.compile(r"^(?P<t>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.]\d+)?(?P<tz>[+-]\d\d:?\d\d|Z)?")


def _unnamed_oom_lines(snap: HealthSnapshot) -> list[str]:
    """Where no PID of the run is known (a saved log, no --pid): OOM kills of a process named like the trainer, not before
    the run's start where both clocks are known, and a line saying the PID was not given. Empty if there is none."""
    started = _started_epoch(snap)
    kills, compared = [], False
    for line in snap.kernel_lines:
        named = KILLED_NAME.search(line)
        if _oom_pid(line) is None or not named or not TRAINER_PROCESS.match((named["name"] or named["task"]).strip()):
            continue
        at = _kernel_epoch(line)
        if started is not None and at is not None:
            compared = True
            if at < started - 1.0:
                continue
        kills.append(line.strip())
    if not kills:
        return []
    name = next(m["name"] or m["task"] for line in kills if (m := KILLED_NAME.search(line)))
    when = (
        "at or after the run's start (--started-at)"
        if compared
        else "at a time not compared with the run's start (the kernel lines carry no wall-clock time: dmesg --time-format iso)"
        if started is not None
        else "at a time not compared with the run's start (give --started-at, and dmesg --time-format iso)"
    )
    note = (
        f"PID not given (--pid): the kernel's OOM killer took a process named like the trainer ({name}) {when}, "
        "and exit code 137 is a SIGKILL's; with the trainer's PID the kill would be certain to be the run's"
    )
    return [*kills[:3], note]


def _kernel_epoch(line: str) -> float | None:
    m = KERNEL_ISO_TIME.match(line.strip())
    if not m:
        return None
    tz = m["tz"] or "+00:00"
    tz = "+00:00" if tz == "Z" else tz if ":" in tz else f"{tz[:3]}:{tz[3:]}"
    return datetime.fromisoformat(m["t"] + tz).timestamp()


def _started_epoch(snap: HealthSnapshot) -> float | None:
    """The run's start on the host's clock: the log's mtime, plus the seconds since that write, less those since launch."""
    if snap.log_mtime_epoch is None or snap.seconds_since_log_write is None or snap.seconds_since_launch is None:
        return None
    return snap.log_mtime_epoch + snap.seconds_since_log_write - snap.seconds_since_launch


def _others_oom(snap: HealthSnapshot) -> list[str]:
    """A note that the kernel's OOM kills were of other processes, so a reader does not take them for the cause."""
    ours = run_pids(snap)
    others = [line.strip() for line in snap.kernel_lines if (pid := _oom_pid(line)) is not None and pid not in ours]
    if not others:
        return []
    known = f"PID {', '.join(map(str, sorted(ours)))}" if ours else "no PID recorded"
    return [f"the kernel's OOM kills name other processes, not the run's ({known}): {others[-1]}"]


def _oom_pid(line: str) -> int | None:
    m = KERNEL_OOM.search(line)
    if not m:
        return None
    return next((int(v) for v in m.groupdict().values() if v is not None), None)


def _session_line(snap: HealthSnapshot) -> str:
    return "tmux session alive" if snap.session_alive else "tmux session gone"
