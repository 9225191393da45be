"""Issue 26: what relaunch does about the failures it used to misread: captured logs -> diagnosis -> remedy.

The logs are the real captures in tests/fixtures/logs/cpu (bench/cpu_capture/capture_issue26.sh); the diagnosis and the
playbook are pure functions, so these tests run no process, but the last, which moves a real cache aside on this machine.
"""

from __future__ import annotations

import re
from pathlib import Path

from relaunch.config import Thresholds
from relaunch.deciding.checkpoints import Entry, choose
from relaunch.deciding.playbook import choose_action, remedy, resume_constraints, steps_for
from relaunch.judging.diagnosis import diagnose
from relaunch.judging.findings import Diagnosis
from relaunch.judging.logtext import clean_lines
from relaunch.judging.snapshot import HealthSnapshot
from relaunch.tasks.warm_cache import warm_cache
from relaunch.testing.faults import making
from relaunch.vocabulary import Action, Cause, Step, Verdict

CPU = Path(__file__).parent / "fixtures" / "logs" / "cpu"
T = Thresholds()
CHECKPOINTS = [Entry(name=f"step_{n}.pt", kind="f", mtime=1000.0 + n) for n in (10, 20)]


def died(fixture: str, exit_code: int = 1, **facts: object) -> Diagnosis:
    lines = clean_lines((CPU / fixture).read_text())  # as the poll reads a log: colour codes stripped
    snap = HealthSnapshot(launched=True, exit_code=exit_code, log_tail=lines, checkpoint="/ckpt/step_20.pt", **facts)
    return diagnose(snap, T)


def resumed_from(d: Diagnosis) -> str | None:
    before_step, refuse = resume_constraints(d)
    entries = [e for e in CHECKPOINTS if e.name != refuse]
    return choose(entries, before_step=before_step).name


def test_a_damaged_compile_cache_is_moved_aside_and_warmed_again_and_the_same_checkpoint_resumed():
    d = died("compile_cache_module_truncated.log")
    assert d.cause is Cause.CORRUPT_CACHE
    assert remedy(d).action is Action.REWARM_CACHE_AND_RELAUNCH
    assert steps_for(remedy(d).action) == [Step.STOP, Step.WARM_CACHE, Step.LAUNCH]
    assert resumed_from(d) == "step_20.pt", "a corrupt cache never makes relaunch pick an earlier checkpoint"


def test_an_intact_checkpoint_that_will_not_load_restores_venv_and_code_and_resumes_from_that_same_checkpoint():
    for fixture in ("checkpoint_weights_only.log", "checkpoint_state_dict_mismatch.log"):
        d = died(fixture)
        assert d.cause is Cause.CHECKPOINT_INCOMPATIBLE, (fixture, d.summary)
        assert steps_for(remedy(d).action) == [Step.BUILD_VENV, Step.STOP, Step.REBUILD_VENV, Step.RESTORE_CODE, Step.LAUNCH]
        assert resumed_from(d) == "step_20.pt", "never skip a checkpoint that is intact"
    # Only damage skips one: the truncated archive of issue 9 is refused, and the one before it taken.
    assert resumed_from(died("truncated_checkpoint_load.log")) == "step_10.pt"


def test_an_intact_checkpoint_that_still_will_not_load_after_the_restore_escalates_naming_the_load_error():
    d = died("checkpoint_weights_only.log")
    action, why = choose_action(d, [d], 3)
    assert action is Action.ESCALATE
    assert "argparse.Namespace" in why, why


def test_a_rendezvous_that_never_completes_escalates_naming_who_never_joined_instead_of_relaunching():
    cases = {
        "tcpstore_rank_never_joins.log": "1 of 2 ranks joined rank 0's store",
        "rendezvous_timeout_static.log": "1 of 2 nodes (torchrun's agents) joined",
        "tcpstore_no_master.log": "rank 0's store at 127.0.0.1:29614",
        "rendezvous_timeout_c10d.log": "c10d rendezvous ran past its join_timeout",
    }
    for fixture, named in cases.items():
        d = died(fixture)
        assert (d.cause, d.rendezvous_incomplete) == (Cause.DISTRIBUTED_FAILURE, True), fixture
        action, why = choose_action(d, [], 3)
        assert action is Action.ESCALATE and named in why, (fixture, why)


def test_a_peer_lost_mid_collective_relaunches_every_rank_together():
    for fixture in ("gloo_peer_lost.log", "gloo_peer_lost_torchrun.log", "torchrun_restarts_exhausted.log"):
        d = died(fixture)
        assert (d.cause, d.rendezvous_incomplete) == (Cause.DISTRIBUTED_FAILURE, False), (fixture, d.summary)
        assert choose_action(d, [], 3)[0] is Action.RELAUNCH


def test_a_preempted_run_resumes_from_the_newest_checkpoint_even_the_one_saved_on_the_signal():
    for fixture, code in (("torchrun_sigterm.log", 1), ("sigterm_saves_checkpoint.log", 143)):
        d = died(fixture, code)
        assert d.cause is Cause.KILLED, (fixture, d.summary)
        assert remedy(d).action is Action.RELAUNCH
    saved_on_signal = [*CHECKPOINTS, Entry(name="step_3304.pt", kind="f", mtime=5000.0)]
    assert choose(saved_on_signal, before_step=resume_constraints(d)[0]).name == "step_3304.pt"


def test_a_dataloader_worker_the_kernel_killed_is_host_oom_when_the_kernel_names_a_pid_of_the_run():
    kernel = (CPU / "dataloader_worker_oom_killed.dmesg").read_text().splitlines()
    worker = re.search(r"DataLoader worker \(pid (\d+)\)", (CPU / "dataloader_worker_oom_killed.log").read_text())[1]
    # RUN/tree: the worker seen by a poll; or only the trainer's own word names it: either way the kill is the run's.
    assert died("dataloader_worker_oom_killed.log", kernel_lines=kernel, tree_pids=[int(worker)]).cause is Cause.HOST_OOM_KILLED
    assert died("dataloader_worker_oom_killed.log", kernel_lines=kernel).cause is Cause.HOST_OOM_KILLED
    # Another job's kill (its pid nowhere in the run) leaves the worker's death a native crash.
    other = [line.replace(worker, "4242") for line in kernel]
    assert died("dataloader_worker_oom_killed.log", kernel_lines=other).cause is Cause.NATIVE_CRASH


def test_compile_cache_warnings_followed_by_step_lines_are_healthy():
    lines = (CPU / "compile_cache_entries_truncated.log").read_text().splitlines()
    snap = HealthSnapshot(launched=True, pid_alive=True, log_tail=lines, seconds_since_launch=600, seconds_since_log_write=1)
    assert diagnose(snap, T).verdict is Verdict.HEALTHY


def test_a_damaged_cache_is_moved_aside_and_kept_where_a_merely_stale_one_is_removed(tmp_path):
    with making(tmp_path) as make:
        for keep in (True, False):
            t = make()
            module = Path(t.inductor_cache_dir) / "dq" / "cdqj2tkfkljmmax75bzdji2r6vhteewlixxosy2bcgkpeh4bl2hw.py"
            module.parent.mkdir(parents=True)
            module.write_text("import r")  # a generated module cut short, as in cpu/compile_cache_module_truncated.log
            step = warm_cache.fn(t, keep_aside=keep)
            assert not module.exists(), "the fresh cache does not hold the damaged module"
            asides = list(Path(t.inductor_cache_dir).parent.glob("*.relaunch-cleared-*"))
            if keep:
                assert Path(step.detail.kept_aside, "dq", module.name).read_text() == "import r"
            else:
                assert step.detail.kept_aside is None and not asides, "only cache, and not damaged: removed"
