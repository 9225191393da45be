"""Pure guards that keep relaunch from losing work: checkpoint choice, path checks, prune selection, redo rules."""

from __future__ import annotations

import pytest

from relaunch.config import Target
from relaunch.deciding.checkpoints import Entry, choose, step_of
from relaunch.deciding.playbook import redo_unfinished, steps_for
from relaunch.plans.checkpoint_listing import read_listing
from relaunch.plans.rebuild_venv import old_venvs_to_remove
from relaunch.plans.warm_cache import CACHE_MARKER, foreign_entries, parse_aside
from relaunch.vocabulary import Action

GOOD = dict(name="t", repo_dir="/root/r", venv_dir="/root/r/.venv", lock_file="req.lock", launch_command="x", log_dir="/w/logs")


def entries(*names: str, kind: str = "d") -> list[Entry]:
    return [Entry(name=n, kind=kind, mtime=1000.0 + i) for i, n in enumerate(names)]


@pytest.mark.parametrize(
    ("names", "chosen"),
    [
        (["step_000700", "step_000800", "step_000900"], "step_000900"),
        # Written in step order: iter_0000099 written after iter_0000900 is another trajectory's (test_checkpoint_trajectory.py).
        (["iter_0000099", "iter_0000800", "iter_0000900"], "iter_0000900"),
        (["checkpoint-800", "checkpoint-900", "checkpoint-1000"], "checkpoint-1000"),
        (["global_step900", "global_step1000"], "global_step1000"),
        # An epoch's number counts before its step (issue 44: a loop whose step starts again each epoch).
        (["epoch_3_step_900.pt", "epoch_9_step_800.pt"], "epoch_9_step_800.pt"),
        (["step_600", "step_999 (copy)", "step_abc"], "step_600"),
        (["step_600", "step_900.tmp", "tmp-checkpoint-1000", "step_950.partial"], "step_600"),
        (["800", "900", "latest"], "900"),
        (["step_08", "step_09", "step_10"], "step_10"),
    ],
)
def test_the_newest_checkpoint_is_the_highest_step_in_base_ten_whatever_the_naming_scheme(names, chosen):
    assert choose(entries(*names)).name == chosen


def test_zero_padded_numbers_are_read_in_base_ten_never_octal():
    assert [step_of(n) for n in ("step_000800", "iter_0000900", "step_08", "step_09")] == [800, 900, 8, 9]


def test_the_choice_says_why_and_names_what_it_skipped():
    choice = choose(entries("step_600", "step_999 (copy)", "step_900.tmp", ".hidden_1000"))
    assert choice.name == "step_600" and choice.step == 600 and "highest step (600)" in choice.why
    assert any("step_999 (copy)" in s and "not a checkpoint name" in s for s in choice.skipped)
    assert any("step_900.tmp" in s and "unfinished" in s for s in choice.skipped)


def test_an_empty_checkpoint_folder_is_never_resumed_from():
    listing = "d 1.0 N step_600\0d 2.0 E step_700\0"
    assert choose(read_listing(listing).entries).name == "step_600"


def test_equal_steps_go_to_the_newest_and_refused_or_later_ones_are_skipped():
    es = [
        Entry(name="step_900", kind="d", mtime=5.0),
        Entry(name="step_900.pt", kind="f", mtime=9.0),
        Entry(name="step_800", kind="d", mtime=1.0),
    ]
    assert choose(es).name == "step_900.pt"
    assert choose(es, refused={(9, "step_900.pt")}).name == "step_900"
    assert choose(es, refused={(8, "step_900.pt")}).name == "step_900.pt", "a newer file under a refused name is a new checkpoint"
    assert choose(es, before_step=900).name == "step_800"


def test_a_listing_with_newlines_in_names_is_read_whole():
    listing = "d 1.0 N step_100\nstep_999\0d 2.0 N step_200\0"
    assert [e.name for e in read_listing(listing).entries] == ["step_100\nstep_999", "step_200"]
    assert choose(read_listing(listing).entries).name == "step_200"


def test_pruning_picks_only_old_venvs_of_this_venv_beyond_the_newest_kept():
    siblings = [
        "venv",
        "venv.old-20260101T000000.000000Z",
        "venv.old-20260102T000000.000000Z",
        "venv.old-20260103T000000.000000Z",
        "precious",
        "venv.incomplete-1",
        "venvX.old-1",
    ]
    assert old_venvs_to_remove("/x/venv", siblings, keep=2) == ["venv.old-20260101T000000.000000Z"]
    assert old_venvs_to_remove("/x/venv", siblings, keep=5) == []


@pytest.mark.parametrize(
    ("kind", "names", "foreign"),
    [
        ("d", ["ab", "fxgraph", "aotautograd", "triton", "locks", "cache"], []),
        ("d", ["ab", "step_600", "notes.txt"], ["step_600", "notes.txt"]),
        ("d", [CACHE_MARKER, "anything", "half-written.bin"], []),
        ("l", [], ["(a symbolic link)"]),
    ],
)
def test_only_what_is_known_to_be_compile_cache_is_removed_after_the_move_aside(kind, names, foreign):
    assert foreign_entries(kind, names) == foreign


def test_the_move_aside_listing_keeps_names_with_newlines_whole():
    out = "aside /c.relaunch-cleared-1\0bytes 42\0kind d\0entry ab\0entry a\nb\0"
    assert parse_aside(out) == ("/c.relaunch-cleared-1", 42, "d", ["ab", "a\nb"])


@pytest.mark.parametrize(
    ("action", "unfinished", "steps"),
    [
        (Action.RELAUNCH, ["rebuild_venv"], "build_venv stop rebuild_venv launch"),
        (Action.RELAUNCH, ["warm_cache"], "stop warm_cache launch"),
        (Action.INSTALL_AND_RELAUNCH, ["rebuild_venv", "warm_cache"], "build_venv stop rebuild_venv install_package warm_cache launch"),
        (Action.REWARM_AND_RELAUNCH, ["warm_cache"], "stop restore_code warm_cache launch"),
        (Action.RELAUNCH, [], "stop launch"),
        (Action.NONE, ["warm_cache"], ""),
        (Action.ESCALATE, ["rebuild_venv"], ""),
    ],
)
def test_a_step_a_killed_recovery_left_unfinished_is_redone_in_procedure_order(action, unfinished, steps):
    assert " ".join(s.value for s in steps_for(action, unfinished)) == steps
    _, why = redo_unfinished(action, "because", unfinished)
    assert ("interrupted" in why) == bool(set(unfinished) - {s.value for s in action.steps})


def test_a_cache_dir_is_refused_when_it_overlaps_the_users_work_or_the_system():
    bad = ["/w/ck", "/w/ck/../ck/kernels", "/w/logs", "/w", "/tmp/../usr", "/tmp", "/home/alice", "/usr/lib/x", "/", "/root/r"]
    for cache in bad:
        with pytest.raises(ValueError, match="inductor_cache_dir"):
            Target(**GOOD, checkpoint_dir="/w/ck", inductor_cache_dir=cache)
    Target(**GOOD, checkpoint_dir="/w/ck", inductor_cache_dir="/tmp/torchinductor_root")
