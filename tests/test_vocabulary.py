"""One vocabulary (relaunch/vocabulary.py) and every table keyed by it agree: each step of every action has a runner, a
goodput category, a detail record and, where the dry run shows it, a plan; a step without a runner fails loudly."""

from __future__ import annotations

import itertools
import typing

import pytest

from relaunch.deciding.playbook import PLAYBOOK, steps_for
from relaunch.flows.recover import OWN_CALLERS, RUNNERS, NoRunner, run_steps
from relaunch.judging.findings import Diagnosis
from relaunch.judging.snapshot import HealthSnapshot
from relaunch.plans import PLANS
from relaunch.steps import StepDetail
from relaunch.tasks.health import HealthResult
from relaunch.testing.targets import shell_target
from relaunch.vocabulary import Action, Category, Cause, Step, Verdict


def planned_steps() -> set[Step]:
    """Every step any action may run, a killed recovery's unfinished steps included (steps_for adds them)."""
    steps: set[Step] = set()
    for action in Action:
        for n in range(3):
            for unfinished in itertools.combinations([s.value for s in Step], n):
                steps |= set(steps_for(action, list(unfinished)))
    return steps


def test_every_step_is_run_by_exactly_one_of_the_runner_table_or_its_own_caller():
    assert set(RUNNERS) | OWN_CALLERS == set(Step)
    assert not set(RUNNERS) & OWN_CALLERS
    assert {s for s in Step if s.of_an_action} == set(RUNNERS)


def test_every_step_an_action_can_plan_has_a_runner_and_none_of_them_has_its_own_caller():
    # A killed preflight, leftovers' stop or rollback leaves its marker too: once added to a plan, and fell through to
    # a launch.
    planned = planned_steps()
    assert planned <= set(RUNNERS), planned - set(RUNNERS)
    assert not planned & OWN_CALLERS


def test_every_cause_has_its_own_playbook_row_and_every_verdict_a_default():
    # A cause without a row would take its verdict's default silently: its remedy and its reason for a person unwritten.
    assert set(Cause) <= {cause for _, cause in PLAYBOOK}, set(Cause) - {cause for _, cause in PLAYBOOK}
    assert {verdict for verdict, cause in PLAYBOOK if cause is None} == set(Verdict)


@pytest.mark.parametrize("step", list(Step))
def test_every_step_has_a_goodput_category_read_without_a_default(step):
    assert isinstance(step.category, Category)


def test_every_step_has_one_detail_record_named_by_it():
    union = typing.get_args(typing.get_args(StepDetail)[0])
    kinds = [typing.get_args(detail.model_fields["kind"].annotation)[0] for detail in union]
    assert sorted(kinds) == sorted(s.value for s in Step)


def test_every_step_of_the_full_recovery_the_dry_run_shows_has_a_plan():
    shown = {Step.PREFLIGHT, Step.STOP_LEFTOVERS, *Action.FULL_RECOVERY.steps}
    assert shown <= set(PLANS), shown - set(PLANS)


def test_a_step_planned_without_a_runner_fails_the_recovery_before_any_step_runs(tmp_path, monkeypatch):
    target = shell_target(tmp_path)
    monkeypatch.delitem(RUNNERS, Step.WARM_CACHE)
    ran: list[str] = []
    monkeypatch.setitem(RUNNERS, Step.STOP, lambda run: ran.append("stop") or [])
    health = HealthResult(
        diagnosis=Diagnosis(verdict=Verdict.CRASHED), snapshot=HealthSnapshot(host="local", launched=True), polls=1, seconds=0.0
    )
    with pytest.raises(NoRunner, match="warm_cache"):
        run_steps(target, Action.REWARM_AND_RELAUNCH, health, 1)
    assert ran == [], "nothing of the attempt ran"
