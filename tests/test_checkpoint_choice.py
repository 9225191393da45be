"""Which checkpoint a relaunch resumes from when a save may be unfinished: framework trackers, saves cut short
by a stop's SIGKILL or a death, folders relaunch cannot read, and loaders that take the parent folder.

The pure tests feed `choose` listings; the rest list real folders on this machine through the real host script
(`relaunch/host/list_checkpoints.sh`), with the run's records written where launch.sh, stop.sh and the
supervisor write them, and two stop a real trainer in tmux with the real stop.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relaunch import runlayout
from relaunch.config import Target
from relaunch.deciding.checkpoints import Entry, RunFacts, choose
from relaunch.errors import CheckpointUnusable
from relaunch.plans.checkpoint_listing import read_listing
from relaunch.plans.launch import plan_list_checkpoints, trainer_command
from relaunch.tasks.launch import describe, launch, pick_checkpoint
from relaunch.tasks.stop import stop
from relaunch.testing.faults import making, wait_for
from relaunch.testing.targets import shell_target
from relaunch.wire.transport import run, transport_for

# ---------------------------------------------------------------------------------------------
# Pure choices over listings


def folders(*names: str, at: float = 1000.0) -> list[Entry]:
    return [Entry(name=n, kind="d", mtime=at + i) for i, n in enumerate(names)]


def test_megatron_resumes_from_the_iteration_its_tracker_names_not_the_unfinished_one_above_it():
    es = folders("iter_0000020", "iter_0000040", "iter_0000060")
    choice = choose(es, contents={"latest_checkpointed_iteration.txt": "40"})
    assert (choice.name, choice.step) == ("iter_0000040", 40), choice
    assert "latest_checkpointed_iteration.txt ('40') names it" in choice.why
    assert any(s.startswith("'iter_0000060': newer than what latest_checkpointed_iteration.txt") for s in choice.skipped), choice


def test_megatron_release_is_taken_when_its_tracker_says_release():
    es = [*folders("iter_0000040"), Entry(name="release", kind="d", mtime=5.0)]
    choice = choose(es, contents={"latest_checkpointed_iteration.txt": "release\n"})
    assert (choice.name, choice.step) == ("release", None), choice


def test_deepspeed_latest_file_and_a_latest_link_name_the_checkpoint_taken():
    es = folders("global_step800", "global_step900", "global_step1000")
    assert choose(es, contents={"latest": "global_step900"}).name == "global_step900"
    link = [*folders("step_100", "step_200", "step_300"), Entry(name="latest", kind="l", mtime=1.0)]
    assert choose(link, links={"latest": "/ck/step_200/"}).name == "step_200"


@pytest.mark.parametrize(
    ("contents", "links", "says"),
    [
        ({"latest_checkpointed_iteration.txt": "80"}, {}, "names iteration 80, but checkpoint_dir holds no iter_0000080"),
        ({"latest_checkpointed_iteration.txt": "garbage"}, {}, "neither an iteration number nor `release`"),
        ({"latest": "global_step99"}, {}, "names no entry that checkpoint_dir holds"),
        ({}, {"latest": "step_999"}, "points to nothing checkpoint_dir holds"),
        ({"latest_checkpointed_iteration.txt": "40", "latest": "iter_0000020"}, {}, "its trackers disagree"),
    ],
)
def test_a_tracker_naming_what_is_not_there_escalates_instead_of_guessing(contents, links, says):
    choice = choose(folders("iter_0000020", "iter_0000040"), contents=contents, links=links)
    assert choice.name is None and choice.escalate and says in choice.escalate, choice


def test_a_save_growing_after_a_stop_that_had_to_sigkill_is_skipped_unless_a_tracker_names_it():
    es = [Entry(name="step_10.pt", kind="f", mtime=100.0), Entry(name="step_20.pt", kind="f", mtime=205.0)]
    killed = RunFacts(started_at=50.0, stop_term_at=200.0, stop_killed_at=260.0, exit_code=137, exit_at=260.1)
    choice = choose(es, run=killed)
    assert choice.name == "step_10.pt", choice
    assert "'step_20.pt': written while the trainer was being killed" in choice.skipped[0], choice
    # A tracker is written once the save is complete: its word wins.
    assert choose(es, run=killed, links={"latest": "step_20.pt"}).name == "step_20.pt"
    # The stop let it finish: it exited by itself within the grace, after its SIGTERM.
    finished = RunFacts(started_at=50.0, stop_term_at=200.0, exit_code=0, exit_at=206.0)
    assert choose(es, run=finished).name == "step_20.pt"


@pytest.mark.parametrize(
    ("code", "chosen"),
    [(137, "step_10.pt"), (143, "step_10.pt"), (139, "step_20.pt"), (1, "step_20.pt")],
    ids=["sigkill_from_outside", "sigterm_from_outside", "its_own_sigsegv", "its_own_exception"],
)
def test_a_save_written_just_before_a_kill_from_outside_is_skipped_but_not_one_before_a_crash_of_its_own(code, chosen):
    es = [Entry(name="step_10.pt", kind="f", mtime=100.0), Entry(name="step_20.pt", kind="f", mtime=299.5)]
    assert choose(es, run=RunFacts(started_at=50.0, exit_code=code, exit_at=300.0)).name == chosen


def test_a_trainer_saving_every_quarter_second_killed_from_outside_loses_only_the_save_it_was_writing():
    # step_5.pt .. step_40.pt, one every 0.25 s, all inside the death's window; SIGKILLed while writing step_40.pt.
    es = [Entry(name=f"step_{5 * i}.pt", kind="f", mtime=299.0 + 0.25 * i) for i in range(1, 9)]
    died = RunFacts(started_at=50.0, exit_code=137, exit_at=301.02)
    choice = choose(es, run=died)
    assert choice.name == "step_35.pt", choice
    assert len(choice.skipped) == 1 and choice.skipped[0].startswith("'step_40.pt': still being written when the trainer died"), choice
    # Saved aside and renamed (demo/trainer/multirank.py): the aside file was being written, every step_N.pt is whole.
    aside = [*es, Entry(name=".step_45.pt.tmp", kind="f", mtime=301.01)]
    assert choose(aside, run=died).name == "step_40.pt"
    # Ranks a killed torchrun left running saved on after its death until the recovery's stop ended them (within its
    # grace): the listing after that stop still skips the one save around the death, and only that one.
    survivors = [*es, Entry(name="step_45.pt", kind="f", mtime=301.25)]
    stopped = RunFacts(started_at=50.0, exit_code=137, exit_at=301.02, stop_term_at=306.0)
    after_stop = choose(survivors, run=stopped)
    assert after_stop.name == "step_40.pt" and len(after_stop.skipped) == 1, after_stop


def test_only_the_current_runs_writes_around_its_death_are_suspect():
    es = [Entry(name="step_10.pt", kind="f", mtime=100.0), Entry(name="step_20.pt", kind="f", mtime=299.5)]
    started_after = RunFacts(started_at=299.8, exit_code=137, exit_at=300.0)  # step_20 is an earlier run's
    assert choose(es, run=started_after).name == "step_20.pt"
    long_after = RunFacts(started_at=50.0, exit_code=137, exit_at=200.0)  # written by someone else, long after
    assert choose(es, run=long_after).name == "step_20.pt"


def test_a_folders_newest_write_inside_it_counts_not_its_own_mtime():
    grown = [Entry(name="step_10", kind="d", mtime=100.0), Entry(name="step_20", kind="d", mtime=150.0, newest=230.0)]
    killed = RunFacts(started_at=50.0, stop_term_at=200.0, stop_killed_at=260.0, exit_code=137, exit_at=260.1)
    assert choose(grown, run=killed).name == "step_10"


# The names a run gives its saves ({s} its step, {e} an epoch that grows with it), and files of no run's series that
# people keep beside them: a base model, a converted or downloaded checkpoint, a seed's file.
RUN_SERIES = [
    "step_{s}.pt",
    "ckpt_{s:06d}.pt",
    "iter_{s:07d}",
    "global_step{s}",
    "checkpoint-{s}",
    "epoch={e}-step={s}.ckpt",
    "e{e}_s{s}.pt",
]
FOREIGN = ["resnet{n}.pt", "llama3-8b-{n}.pt", "gpt2-{n}.bin", "seed{n}.pt", "bert_base_{n}.safetensors", "init_{n}.pt", "pretrained-{n}"]


@given(
    st.sampled_from(RUN_SERIES),
    st.lists(st.integers(1, 10**5), min_size=1, max_size=4, unique=True).map(sorted),
    st.sampled_from(FOREIGN),
    st.integers(1, 10**7),
    st.floats(1, 900),
)
def test_a_file_of_another_series_is_never_resumed_from_over_the_runs_own_newest_saves(series, steps, foreign, n, older_by):
    """`resnet50.pt` (a base model kept in checkpoint_dir) beside the run's step_10.pt and step_20.pt was resumed from:
    the highest number of any name won. Numbers compare only within one series (other numbers in a name, as
    Lightning's epoch, are the series' own); the series is the run's newest save's."""
    saves = [Entry(name=series.format(s=s, e=i), kind="d" if "." not in series else "f", mtime=2000.0 + i) for i, s in enumerate(steps)]
    other = Entry(name=foreign.format(n=n), kind="f" if "." in foreign else "d", mtime=2000.0 - older_by)
    choice = choose([other, *saves])
    assert (choice.name, choice.step) == (saves[-1].name, steps[-1]), choice
    assert any(other.name in said for said in choice.skipped), choice


@given(
    st.sampled_from(
        ["step_{s}_rank{r}.pt", "ckpt-{s}.rank{r}.pt", "iter_{s:07d}_mp_rank_{r:02d}.pt", "step{s}-shard{r}.pt", "step_{s}_of{r}"]
    ),
    st.integers(2, 8),
    st.lists(st.integers(1, 10**5), min_size=1, max_size=3, unique=True).map(sorted),
    st.data(),
)
def test_a_checkpoint_saved_as_one_file_per_rank_is_never_resumed_from_by_one_ranks_file(form, ranks, steps, data):
    """`step_600_rank1.pt` read as step 1 of a series `step_600_rank`: one rank's shard passed to every rank, or the
    one whole shard of a save whose other rank was cut. A rank's or shard's number is no step."""
    entries = [
        Entry(name=form.format(s=s, r=r), kind="f", mtime=2000.0 + i, empty=(i == len(steps) - 1 and r == cut))
        for i, s in enumerate(steps)
        for cut in [data.draw(st.integers(-1, ranks - 1))]
        for r in range(ranks)
    ]
    for mode in ("entry", "folder"):
        choice = choose(entries, resume_from=mode)
        chosen = [e for e in entries if e.name == choice.name]
        assert not chosen or mode == "folder", (mode, choice)
        of_step = {form.format(s=choice.step, r=r) for r in range(ranks)} if choice.step is not None else set()
        assert not any(e.empty for e in entries if e.name in of_step), choice


def test_a_folder_of_names_relaunch_cannot_use_escalates_and_one_of_only_unfinished_saves_starts_from_scratch():
    parts = [Entry(name="step_1000_model.pt", kind="f", mtime=1.0), Entry(name="notes.txt", kind="f", mtime=1.0)]
    choice = choose(parts)
    assert choice.name is None and choice.blocked_by == "nothing_usable" and choice.escalate, choice
    unfinished = [Entry(name=".step_10.pt.tmp", kind="f", mtime=1.0), Entry(name="step_20.partial", kind="f", mtime=1.0)]
    assert choose(unfinished).escalate is None and "starting from scratch" in choose(unfinished).why


def test_a_checkpoint_saved_as_one_file_per_part_is_used_only_where_the_trainer_gets_the_folder():
    es = [Entry(name="step_1000_model.pt", kind="f", mtime=1.0), Entry(name="step_1000_optim.pt", kind="f", mtime=1.0)]
    entry = choose(es)
    assert entry.escalate and "step 1000's checkpoint saved as 2 files" in entry.skipped[0], entry
    folder = choose(es, resume_from="folder")
    assert (folder.name, folder.step, folder.parts) == ("step_1000_model.pt", 1000, ["step_1000_model.pt", "step_1000_optim.pt"])
    half = [es[0], Entry(name="step_1000_optim.pt", kind="f", mtime=1.0, empty=True)]
    assert choose(half, resume_from="folder").name is None, "a part that never wrote leaves the group incomplete"


def test_with_resume_from_folder_a_choice_the_loader_would_not_make_escalates():
    es = folders("step_10", "step_20")
    folder = choose(es, resume_from="folder")
    assert folder.name == "step_20" and "will take step_20, as relaunch chose" in folder.why, folder
    ruled_out = choose(es, before_step=20, resume_from="folder")
    assert ruled_out.blocked_by == "loader" and "it would take step_20" in (ruled_out.escalate or ""), ruled_out


def test_every_record_of_the_listing_is_read_and_a_name_with_spaces_or_a_newline_stays_whole():
    listing = (
        "present\n"
        "d 10.5 N iter_0000040\0d 11.0 N odd name\nhere\0f 12.0 N latest_checkpointed_iteration.txt\0l 13.0 N latest\0"
        "W 99.25 iter_0000040\0L latest/iter_0000040\0C latest_checkpointed_iteration.txt/40\0S 7 step_600.pt\0"
        "R run r-1\0R started_at 5.5\0R stop_term_at 90.000001\0R exit_code 137\0R exit_at 95.5\0"
    )
    found = read_listing(listing)
    assert [(e.name, e.written) for e in found.entries][:2] == [("iter_0000040", 99.25), ("odd name\nhere", 11.0)]
    assert found.links == {"latest": "iter_0000040"} and found.contents == {"latest_checkpointed_iteration.txt": "40"}
    assert found.refused == {(7, "step_600.pt")}
    assert found.run == RunFacts(run_id="r-1", started_at=5.5, stop_term_at=90.000001, exit_code=137, exit_at=95.5)
    assert not read_listing("missing\n").present


# ---------------------------------------------------------------------------------------------
# Real folders through the real host script


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Target:
    return shell_target(tmp_path_factory.mktemp("ckpt-choice"))


@pytest.fixture
def target(base, tmp_path) -> Target:
    """The module's target with a checkpoint folder and state folder of this test's own."""
    (tmp_path / "ckpt").mkdir()
    return base.model_copy(update={"checkpoint_dir": str(tmp_path / "ckpt"), "state_dir": str(tmp_path / "state")})


def listed(target: Target) -> str:
    command = plan_list_checkpoints(target)
    assert command is not None
    return run(transport_for(target.host), command).stdout


def write(path: Path, data: bytes = b"x" * 1024) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def run_folder(target: Target, run_id: str = "run-1") -> Path:
    """A current run as launch.sh records it (STATE/current, STATE/runs/ID/started_at)."""
    folder = Path(runlayout.run_folder(target.state_path, run_id))
    folder.mkdir(parents=True)
    Path(runlayout.current_file(target.state_path)).write_text(f"{run_id}\n")
    stamp(folder / "started_at")
    return folder


def stamp(path: Path) -> float:
    """As stop.sh stamps: host epoch seconds with microseconds."""
    now = time.time()
    path.write_text(f"{now:.6f}\n")
    return now


def grow_past(path: Path, moment: float) -> None:
    """Append to a checkpoint until its mtime is past `moment` (file times lag the clock by a few ms)."""
    with path.open("ab") as f:
        while True:
            f.write(b"y" * 4096)
            f.flush()
            os.fsync(f.fileno())
            if path.stat().st_mtime > moment:
                return


def test_megatron_layout_on_disk_resumes_from_the_tracked_iteration_and_the_folder_form_passes_the_parent(target):
    ckpt = Path(target.checkpoint_dir)
    write(ckpt / "iter_0000040" / "mp_rank_00" / "model_optim_rng.pt")
    write(ckpt / "iter_0000060" / "mp_rank_00" / "model_optim_rng.pt", b"half")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("40")
    choice = pick_checkpoint(target, listed(target))
    assert (choice.name, choice.step) == ("iter_0000040", 40), describe(choice)
    folder = target.model_copy(update={"resume_from": "folder", "resume_arg": "--load {checkpoint}"})
    choice = pick_checkpoint(folder, listed(folder))
    assert choice.name == "iter_0000040" and "its loader reads latest_checkpointed_iteration.txt ('40')" in choice.why, describe(choice)
    assert "and will take iter_0000040, as relaunch chose" in choice.why
    assert trainer_command(folder, f"{ckpt}/{choice.name}") == f"bash stepper.sh --load {ckpt}"
    (ckpt / "latest_checkpointed_iteration.txt").write_text("release\n")
    write(ckpt / "release" / "mp_rank_00" / "model_optim_rng.pt")
    assert pick_checkpoint(target, listed(target)).name == "release"


def test_deepspeed_latest_file_and_a_latest_link_on_disk_name_the_checkpoint(target):
    ckpt = Path(target.checkpoint_dir)
    for tag in ("global_step800", "global_step900", "global_step1000"):
        write(ckpt / tag / "mp_rank_00_model_states.pt")
    (ckpt / "latest").write_text("global_step900")
    write(ckpt / "zero_to_fp32.py", b"# DeepSpeed writes this beside its checkpoints\n")
    assert pick_checkpoint(target, listed(target)).name == "global_step900"
    (ckpt / "latest").unlink()
    (ckpt / "latest").symlink_to(ckpt / "global_step800")
    assert pick_checkpoint(target, listed(target)).name == "global_step800"
    (ckpt / "latest").unlink()
    (ckpt / "latest").symlink_to(ckpt / "global_step700")
    with pytest.raises(CheckpointUnusable, match="points to nothing checkpoint_dir holds"):
        pick_checkpoint(target, listed(target))


def test_on_disk_a_save_growing_while_the_stop_sigkilled_is_skipped_and_one_saved_on_sigterm_is_taken(target):
    ckpt = Path(target.checkpoint_dir)
    write(ckpt / "step_10.pt")
    rec = run_folder(target)
    term = stamp(rec / "stop_term_at")
    grow_past(write(ckpt / "step_20.pt"), term)
    stamp(rec / "stop_killed_at")
    (rec / "exit_code").write_text("137\n")
    choice = pick_checkpoint(target, listed(target))
    assert choice.name == "step_10.pt", describe(choice)
    assert "'step_20.pt': written while the trainer was being killed" in describe(choice)

    (rec / "stop_killed_at").unlink()
    (rec / "exit_code").write_text("0\n")  # it saved on its SIGTERM and exited by itself within the grace
    assert pick_checkpoint(target, listed(target)).name == "step_20.pt"


def test_on_disk_a_file_growing_inside_a_folder_when_the_trainer_was_killed_marks_the_folder(target):
    ckpt = Path(target.checkpoint_dir)
    write(ckpt / "step_10" / "model.pt")
    write(ckpt / "step_20" / "model.pt")
    rec = run_folder(target)
    term = stamp(rec / "stop_term_at")
    grow_past(ckpt / "step_20" / "model.pt", term)
    os.utime(ckpt / "step_20", (term - 30, term - 30))  # the folder's own mtime says nothing of its files
    stamp(rec / "stop_killed_at")
    assert pick_checkpoint(target, listed(target)).name == "step_10"


def test_on_disk_a_folder_holding_only_names_relaunch_cannot_read_escalates_naming_them_and_what_to_do(target):
    ckpt = Path(target.checkpoint_dir)
    write(ckpt / "step_1000_model.pt")
    write(ckpt / "step_1000_optim.pt")
    with pytest.raises(CheckpointUnusable) as raised:
        pick_checkpoint(target, listed(target))
    text = str(raised.value)
    assert text.startswith(f"on local: `list checkpoints {ckpt}` (exit 0): checkpoint_dir {ckpt}: it holds 2 name(s)"), text
    assert "'step_1000_model.pt + step_1000_optim.pt': step 1000's checkpoint saved as 2 files" in text
    assert "what to do: tell relaunch how to resume: set resume_arg" in text and "empty checkpoint_dir" in text
    folder = target.model_copy(update={"resume_from": "folder"})
    assert pick_checkpoint(folder, listed(folder)).parts == ["step_1000_model.pt", "step_1000_optim.pt"]


# ---------------------------------------------------------------------------------------------
# A real trainer, stopped by the real stop

# Saves step_10.pt, then steps; on SIGTERM it saves step_20.pt (slowly: a few writes) and exits, unless
# IGNORE_TERM is set: then it keeps growing step_20.pt until the stop SIGKILLs it.
SAVING_TRAINER = """#!/usr/bin/env bash
ckpt=$1
printf x > "$ckpt/step_10.pt"
save() {
  echo "saving step_20"
  for _ in 1 2 3; do printf 'chunk' >> "$ckpt/step_20.pt"; sleep 0.1; done
  [ -n "$IGNORE_TERM" ] && while :; do printf 'chunk' >> "$ckpt/step_20.pt"; sleep 0.05; done
  echo "saved step_20"; exit 0
}
trap save TERM
for i in $(seq 1 100000); do echo "step=$i loss=3.6441"; sleep 0.1 & wait $!; done
"""


@pytest.fixture
def made(tmp_path):
    # 5 s: a trainer that saves on SIGTERM (0.3 s of writes) is still within its grace on a host whose every core is busy.
    with making(tmp_path, stop_grace_seconds=5.0) as make:
        yield make


def saving_target(made, tmp_path: Path, **env: str) -> Target:
    (tmp_path / "trainer.sh").write_text(SAVING_TRAINER)
    ckpt = tmp_path / "saved"
    ckpt.mkdir()
    return made(launch_command=f"bash {tmp_path / 'trainer.sh'} {ckpt}", checkpoint_dir=str(ckpt), env=env)


@pytest.mark.parametrize("ignores_term", [False, True], ids=["saves_on_sigterm_and_exits", "sigkilled_mid_save"])
def test_after_a_real_stop_the_save_it_let_finish_is_taken_and_the_one_it_cut_short_is_not(made, tmp_path, ignores_term):
    t = saving_target(made, tmp_path, **({"IGNORE_TERM": "1"} if ignores_term else {}))
    launch.fn(t, 1)
    wait_for(lambda: (Path(t.checkpoint_dir) / "step_10.pt").exists(), 30, "the first checkpoint")
    stop.fn(t)
    rec = Path(runlayout.run_folder(t.state_path, Path(runlayout.current_file(t.state_path)).read_text().strip()))
    assert (rec / "stop_term_at").exists() and (rec / "stop_killed_at").exists() == ignores_term, sorted(os.listdir(rec))
    choice = pick_checkpoint(t, listed(t))
    assert choice.name == ("step_10.pt" if ignores_term else "step_20.pt"), describe(choice)


def test_a_checkpoint_folder_the_launch_would_refuse_fails_the_recovery_before_the_live_run_is_stopped(target):
    """A stalled run whose checkpoint folder holds only names relaunch cannot use: the recovery's steps stop at the
    question asked before the stop, and the trainer is still the same process, stepping."""
    from relaunch.flows.recover import run_steps
    from relaunch.tasks.health import collect_snapshot, poll_until_settled
    from relaunch.vocabulary import Action

    first = launch.fn(target, 1)[0]
    write(Path(target.checkpoint_dir) / "step_1000_model.pt")
    write(Path(target.checkpoint_dir) / "step_1000_optim.pt")
    try:
        health = poll_until_settled(target, timeout_seconds=20)
        with pytest.raises(CheckpointUnusable, match="no checkpoint relaunch can resume from"):
            run_steps(target, Action.RELAUNCH, health, 1)
        after = collect_snapshot(target)
        assert after.pid == first.pid and after.pid_alive, "the run was never stopped"
    finally:
        stop.fn(target)
