"""Issue 35: the root cause, not its knock-on. Each rule is read from real captures (tests/fixtures/logs/cpu, made by
bench/cpu_capture/capture_issue35.sh; PROVENANCE.md there), and its shapes (which rank, the order of the ranks' lines,
which outside signal, the trainer's process name) are varied by Hypothesis over those same captured lines.

1. Within one log, a rank that failed by itself (its own exception, its own native signal) outranks the ranks that only
   lost it (a peer's socket closed or reset, a collective timed out); torchrun's root cause decides between several.
2. An abort after an uncaught distributed error is that error (distributed_failure), not a native crash.
3. A death by a signal from outside (SIGHUP 129, SIGINT 130, SIGTERM 143) is `killed`, whatever the process printed;
   for SIGINT the evidence says a person may have meant it.
4. A saved log without the trainer's PID: an OOM kill of a process named like the trainer, with exit 137 (and not
   before --started-at where the kernel's lines carry a wall-clock time), is host_oom_killed, saying the PID was not given.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from relaunch.cli.app import app
from relaunch.config import Thresholds
from relaunch.deciding.playbook import remedy
from relaunch.judging.diagnosis import diagnose
from relaunch.judging.findings import Diagnosis
from relaunch.judging.logtext import clean_lines
from relaunch.judging.snapshot import HealthSnapshot
from relaunch.vocabulary import Action, Cause, Verdict

CPU = Path(__file__).parent / "fixtures" / "logs" / "cpu"
T = Thresholds()
PREFIX = re.compile(r"^\[rank(\d+)\]:")
CXX_WORDS = re.compile(r"^(?:terminate called after throwing|\s+what\(\):)")


def lines_of(fixture: str) -> list[str]:
    return clean_lines((CPU / fixture).read_text())


def died(lines: list[str], exit_code: int | None = 1, **facts: object) -> Diagnosis:
    return diagnose(HealthSnapshot(launched=True, exit_code=exit_code, log_tail=lines, **facts), T)


def cli(*args: str) -> dict:
    result = CliRunner().invoke(app, ["diagnose", *args, "--json"])
    assert result.exit_code == 1, result.output
    return json.loads(result.output)


# ---- 1. a rank's own failure over its peers' knock-on ---------------------------------------------------------


def test_a_rank_that_raised_its_own_error_is_the_cause_not_the_peer_that_lost_it():
    d = died(lines_of("rank_error_torchrun.log"))
    assert (d.verdict, d.cause) == (Verdict.CRASHED, Cause.ERROR), d.summary
    assert "[rank1]: IndexError: index out of range in self" in d.summary
    assert any("rank 1 failed by itself (torchrun's root cause)" in line and "Connection closed by peer" in line for line in d.evidence)


def test_a_rank_dead_of_its_own_native_signal_outranks_the_rank_torchrun_saw_exit_first():
    # torchrun's "first observed failure" is rank 0, which only lost its peer; its table says rank 1 died of SIGSEGV.
    d = died(lines_of("rank_segv_torchrun.log"))
    assert d.cause is Cause.NATIVE_CRASH, d.summary
    assert "rank 1 (local_rank 1" in d.summary and "SIGSEGV" in d.summary
    assert remedy(d).action is remedy(died(lines_of("abort.log"), 134)).action, "the same remedy as any native crash"


def test_a_rank_killed_from_outside_beside_a_peer_that_lost_it_stays_as_it_was_read():
    # SIGKILL is no failure of the rank's own: the reading issue 26 settled (distributed_failure, all ranks relaunched).
    assert died(lines_of("gloo_peer_lost_torchrun.log")).cause is Cause.DISTRIBUTED_FAILURE


def rank_blocks(fixture: str) -> dict[int, list[str]]:
    blocks: dict[int, list[str]] = {}
    for line in lines_of(fixture):
        if m := PREFIX.match(line):
            blocks.setdefault(int(m[1]), []).append(line[m.end() :])
    return blocks


def relabel(block: list[str], rank: int) -> list[str]:
    return [f"[rank{rank}]:{line}" for line in block]


@settings(max_examples=60, deadline=None)
@given(
    bad=st.integers(0, 63),
    peers=st.lists(st.integers(0, 63), min_size=1, max_size=3, unique=True),
    order=st.randoms(use_true_random=False),
    interleave=st.booleans(),
)
def test_the_rank_that_failed_by_itself_is_named_whatever_its_number_and_the_order_of_the_ranks_lines(bad, peers, order, interleave):
    # The captured blocks of rank_error_torchrun.log: rank 1's own IndexError traceback, rank 0's lost peer; the bad rank
    # and its peers renumbered, the blocks in any order, or their lines interleaved as ranks' stderr can be.
    blocks = rank_blocks("rank_error_torchrun.log")
    peers = [p for p in peers if p != bad] or [(bad + 1) % 64]
    parts = [relabel(blocks[1], bad), *[relabel(blocks[0], p) for p in peers]]
    order.shuffle(parts)
    if interleave:
        lines = [line for group in zip(*[p + [""] * (20 - len(p)) for p in parts], strict=True) for line in group if line]
    else:
        lines = [line for part in parts for line in part]
    d = died(lines)
    assert d.cause is Cause.ERROR, d.summary
    assert d.summary == f"error: [rank{bad}]: IndexError: index out of range in self", d.summary


def test_where_every_rank_only_lost_a_peer_the_first_failure_stays_the_cause():
    for fixture in ("gloo_peer_lost.log", "collective_mismatch_rank1.log", "torchrun_restarts_exhausted.log"):
        assert died(lines_of(fixture)).cause is Cause.DISTRIBUTED_FAILURE, fixture


# ---- 2. an abort after an uncaught distributed error ----------------------------------------------------------


def test_an_abort_after_an_uncaught_distributed_error_is_that_error_not_a_native_crash():
    for fixture, code in (("collective_mismatch.log", 134), ("collective_mismatch_torchrun.log", 1)):
        d = died(lines_of(fixture), code)
        assert d.cause is Cause.DISTRIBUTED_FAILURE, (fixture, d.summary)
        assert "Is there a distributed collective mismatch" in d.summary, d.summary
        assert any("SIGABRT that followed is this error's" in line for line in d.evidence), d.evidence
        assert remedy(d).action is Action.RELAUNCH
    # An abort with no distributed error before it is still the trainer's own native crash.
    assert died(lines_of("abort.log"), 134).cause is Cause.NATIVE_CRASH


@given(code=st.sampled_from([134, None, 1]), cut=st.integers(0, 5))
def test_the_abort_is_read_as_the_distributed_error_whatever_exit_code_was_recorded_and_whatever_follows(code, cut):
    # The uncaught error's lines decide; what the log holds after them (step lines cut from the start) does not.
    lines = lines_of("collective_mismatch.log")[cut:]
    assert died(lines, code).cause is Cause.DISTRIBUTED_FAILURE


@given(merge=st.lists(st.booleans(), min_size=14, max_size=14))
def test_the_abort_is_the_distributed_error_wherever_the_peer_that_lost_it_wrote_its_lines(merge):
    # collective_mismatch_torchrun.log: rank 0's C++ terminate (its two lines unprefixed: C++ writes them, not torch's
    # logging, and apart) and rank 1's `[rank1]:` traceback of the reset connection it saw next. Two processes share
    # the log, so how their lines merge is the kernel's: each keeps its own order, in any merge of the two.
    lines = lines_of("collective_mismatch_torchrun.log")
    words = [i for i, line in enumerate(lines) if CXX_WORDS.match(line)]
    peer = [i for i, line in enumerate(lines) if PREFIX.match(line)]
    head = min(words + peer)
    a, b = [lines[i] for i in words], [lines[i] for i in peer]
    merged = []
    for take_a in merge + [True] * len(a) + [False] * len(b):
        source = a if (take_a and a) or not b else b
        if source:
            merged.append(source.pop(0))
    others = [line for i, line in enumerate(lines) if i not in words and i not in peer]
    d = died([*others[:head], *merged, *others[head:]], 1)
    assert d.cause is Cause.DISTRIBUTED_FAILURE, d.summary
    assert "Is there a distributed collective mismatch" in d.summary, d.summary
    assert any("SIGABRT that followed is this error's" in line for line in d.evidence), d.evidence


# ---- 3. signals from outside ----------------------------------------------------------------------------------


def test_ctrl_c_is_killed_and_says_a_person_may_have_meant_it():
    for fixture in ("keyboard_interrupt.log", "keyboard_interrupt_dataloader.log"):
        d = died(lines_of(fixture), 130)
        assert (d.cause, d.summary) == (Cause.KILLED, "killed by SIGINT"), (fixture, d.summary)
        assert any("a person may have meant" in line for line in d.evidence), d.evidence
        assert remedy(d).action is Action.RELAUNCH
    d = died(lines_of("torchrun_sigint.log"))
    assert d.cause is Cause.KILLED and any("a person may have meant" in line for line in d.evidence), d.evidence


def test_a_keyboard_interrupt_traceback_is_killed_even_where_the_exit_code_was_not_recorded():
    assert died(lines_of("keyboard_interrupt.log"), None).cause is Cause.KILLED


@given(
    signal=st.sampled_from([1, 2, 15]),
    fixture=st.sampled_from(["keyboard_interrupt.log", "generic_error.log", "compile_error.log", "sighup.log", "sigterm.log"]),
)
def test_a_death_by_an_outside_signal_is_killed_whatever_traceback_it_printed(signal, fixture):
    d = died(lines_of(fixture), 128 + signal)
    assert d.cause is Cause.KILLED, (fixture, signal, d.summary)
    assert d.summary.startswith("killed by SIG"), d.summary


@given(signal=st.sampled_from([4, 6, 7, 8, 11]))
def test_a_native_signal_with_a_keyboard_interrupt_free_log_is_no_outside_kill(signal):
    assert died(lines_of("sighup.log"), 128 + signal).cause is Cause.NATIVE_CRASH


# ---- 4. the kernel's OOM killer and a saved log ---------------------------------------------------------------

PID = (CPU / "oom_killed_trainer.pid").read_text().strip()
STARTED = (CPU / "oom_killed_trainer.started_at").read_text().strip()
LOG, DMESG, ISO = (str(CPU / f"oom_killed_trainer.{ext}") for ext in ("log", "dmesg", "dmesg_iso"))


def test_an_oom_kill_of_a_python_process_in_a_saved_log_without_a_pid_is_host_oom_saying_the_pid_was_not_given():
    out = cli(LOG, "--exit-code", "137", "--dmesg", DMESG)
    assert out["cause"] == "host_oom_killed", out
    assert any(f"Killed process {PID} (python)" in line for line in out["evidence"])
    assert any(line.startswith("PID not given (--pid)") for line in out["evidence"]), out["evidence"]


def test_with_the_trainers_pid_the_kill_of_that_pid_is_host_oom_and_another_pids_is_not():
    mine = cli(LOG, "--exit-code", "137", "--dmesg", DMESG, "--pid", PID)
    assert mine["cause"] == "host_oom_killed" and not any("PID not given" in line for line in mine["evidence"]), mine
    other = cli(LOG, "--exit-code", "137", "--dmesg", DMESG, "--pid", "4242")
    assert other["cause"] == "killed", other
    assert any("name other processes, not the run's (PID 4242)" in line for line in other["evidence"]), other["evidence"]


def test_a_kill_before_the_runs_start_is_not_the_runs_where_the_kernel_lines_carry_wall_clock_times():
    assert cli(LOG, "--exit-code", "137", "--dmesg", ISO, "--started-at", STARTED)["cause"] == "host_oom_killed"
    assert cli(LOG, "--exit-code", "137", "--dmesg", ISO, "--started-at", "2026-12-02T21:59:14Z")["cause"] == "host_oom_killed"
    later = cli(LOG, "--exit-code", "137", "--dmesg", ISO, "--started-at", "2026-12-02T22:30:00Z")
    assert later["cause"] == "killed", later
    # seconds since boot cannot be compared with a start: the evidence says so.
    boot = cli(LOG, "--exit-code", "137", "--dmesg", DMESG, "--started-at", STARTED)
    assert boot["cause"] == "host_oom_killed" and any("no wall-clock time" in line for line in boot["evidence"]), boot


def test_started_at_that_is_no_time_is_refused():
    result = CliRunner().invoke(app, ["diagnose", LOG, "--exit-code", "137", "--started-at", "yesterday"])
    assert result.exit_code == 2 and "--started-at" in result.output, result.output


KERNEL = (CPU / "oom_killed_trainer.dmesg").read_text().splitlines()


@given(name=st.sampled_from(["python", "python3", "python3.11", "pt_main_thread", "pt_data_worker", "torchrun"]))
def test_a_kill_of_any_process_named_like_the_trainer_is_the_saved_logs_oom(name):
    kernel = [line.replace("(python)", f"({name})").replace("task=python,", f"task={name},") for line in KERNEL]
    assert died(lines_of("oom_killed_trainer.log"), 137, kernel_lines=kernel).cause is Cause.HOST_OOM_KILLED


@given(name=st.sampled_from(["postgres", "java", "chrome", "node", "containerd"]), code=st.sampled_from([137, 1, None]))
def test_a_kill_of_another_program_or_without_a_sigkills_exit_code_is_not_the_saved_logs_oom(name, code):
    kernel = [line.replace("(python)", f"({name})").replace("task=python,", f"task={name},") for line in KERNEL]
    assert died(lines_of("oom_killed_trainer.log"), code, kernel_lines=kernel).cause is not Cause.HOST_OOM_KILLED
    if code != 137:
        assert died(lines_of("oom_killed_trainer.log"), code, kernel_lines=KERNEL).cause is not Cause.HOST_OOM_KILLED


def test_the_live_poll_keeps_its_rule_only_the_runs_own_tree():
    # The poll records the trainer's PID: a python the kernel killed that is not of its tree is another job's.
    d = died(lines_of("oom_killed_trainer.log"), 137, pid=4242, tree_pids=[4243], kernel_lines=KERNEL)
    assert d.cause is Cause.KILLED, d.summary
    d = died(lines_of("oom_killed_trainer.log"), 137, pid=4242, tree_pids=[int(PID)], kernel_lines=KERNEL)
    assert d.cause is Cause.HOST_OOM_KILLED and not any("PID not given" in line for line in d.evidence)


# ---- a signal inside a wrapper script whose own exit is 0 ---------------------------------------------------------

WRAPPED = {"wrapped_sigkill.log": Cause.KILLED, "wrapped_sigterm.log": Cause.KILLED, "wrapped_sigsegv.log": Cause.NATIVE_CRASH}


def job_line(fixture: str) -> str:
    """bash's own job-status line for its killed child, as captured (the line before the wrapper's echo)."""
    return lines_of(fixture)[-2]


@given(
    st.sampled_from(sorted(WRAPPED)),
    st.integers(1, 40),
    st.lists(st.sampled_from(["start.sh: training script ended", "", "syncing logs...", "done", "exit code was 137"]), max_size=3),
)
def test_a_trainer_ended_by_a_signal_inside_a_script_that_exits_0_is_never_finished(fixture, steps, after):
    """`bash start.sh` running `python train.py` then `echo done`: a SIGKILLed trainer's script exits 0, and was read
    `finished` (never recovered: a green run that gave up). bash's job line after the last step names the signal."""
    log = [*lines_of(fixture)[:steps], job_line(fixture), *after]
    d = died(log, exit_code=0)
    assert (d.verdict, d.cause) == (Verdict.CRASHED, WRAPPED[fixture]), (log[-3:], d.summary)
    assert any("exited 0, but its script's shell reported" in line for line in d.evidence), d.evidence
    assert (died(log, exit_code=None).verdict, died(log, exit_code=None).cause) == (Verdict.CRASHED, WRAPPED[fixture])


@given(st.sampled_from(sorted(WRAPPED)), st.sampled_from(["training complete", "Training completed.", "step={n} loss=1.0"]))
def test_a_signal_before_the_last_step_or_followed_by_the_trainers_own_end_leaves_an_exit_0_finished(fixture, later):
    """A child killed before training went on (a preprocessing step), or a trainer that said it finished after: the 0
    is the run's, as before."""
    log = [*lines_of(fixture)[:3], job_line(fixture), later.format(n=900)]
    assert died(log, exit_code=0).verdict is Verdict.FINISHED
