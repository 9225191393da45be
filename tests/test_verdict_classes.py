"""The Verdict enum owns which verdicts are fine and which need a recovery; the playbook and flows read only that."""

from __future__ import annotations

import pytest

from relaunch.deciding.playbook import choose_action, remedy
from relaunch.judging.findings import Diagnosis
from relaunch.vocabulary import Action, Cause, Verdict


@pytest.mark.parametrize("verdict", list(Verdict))
def test_no_verdict_is_both_fine_and_in_need_of_recovery(verdict):
    assert not (verdict.is_fine() and verdict.needs_recovery())


def test_a_run_that_is_stopped_on_purpose_is_fine_and_never_recovered_by_a_check():
    assert Verdict.STOPPED.is_fine() and not Verdict.STOPPED.needs_recovery()
    assert remedy(Diagnosis(verdict=Verdict.STOPPED)).action is Action.NONE


def test_what_relaunch_will_not_judge_is_neither_fine_nor_recovered_and_escalates():
    for cause in (Cause.NOT_A_TRAINER, Cause.TWO_TRAINERS, None):
        d = Diagnosis(verdict=Verdict.UNMANAGED, cause=cause)
        assert not d.verdict.is_fine() and not d.verdict.needs_recovery()
        assert choose_action(d, [], 3)[0] is Action.ESCALATE


def test_a_diverged_run_is_recovered_by_the_nightly_check_as_its_help_says():
    assert Verdict.DIVERGED.needs_recovery()


def test_a_recovery_asked_for_a_stopped_target_relaunches_it():
    action, why = choose_action(Diagnosis(verdict=Verdict.STOPPED), [], 3)
    assert action is Action.RELAUNCH and "asked" in why


def test_only_the_cache_a_trainer_died_loading_is_kept_aside_by_the_warm_up():
    assert [c for c in Cause if c.keeps_cache_aside()] == [Cause.CORRUPT_CACHE]


@pytest.mark.parametrize("own", [c for c in Cause if c not in (Cause.ERROR, Cause.DISTRIBUTED_FAILURE)])
def test_a_nodes_own_failure_ranks_before_a_plain_error_and_a_lost_collective_as_a_gangs_first_failure(own):
    # judge_gang names the node whose cause ranks lowest: a lost collective is the likeliest knock-on of all.
    assert own.knock_on_rank() < Cause.ERROR.knock_on_rank() < Cause.DISTRIBUTED_FAILURE.knock_on_rank()
