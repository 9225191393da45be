"""Generated log shapes on real trainers in real tmux, launched by relaunch and judged by check_health.fn: the log
rotated under the live trainer (by rename, rename and create, copytruncate, delete) or written through a buffering
pipe, at a drawn step. While it steps, no check calls it stalled or would stop it. One variant runs with every core
busy (tests/load.py): the same verdicts under load."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relaunch.deciding.playbook import remedy
from relaunch.tasks.health import check_health
from relaunch.testing.faults import making, wait_for
from relaunch.vocabulary import Action, Verdict
from tests.test_judging_evidence import checks, launched, never_stalled, verdicts


def recorded_log(target) -> Path:
    return Path(next((Path(target.state_path) / "runs").glob("*/log_path")).read_text().strip())


def rotate(log: Path, how: str) -> None:
    """What logrotate (or a person freeing disk) does to the live log."""
    if how == "rename":
        log.rename(log.with_suffix(".1"))
    elif how == "create":  # rename, then a new empty file where the log was
        log.rename(log.with_suffix(".1"))
        log.touch()
    elif how == "copytruncate":
        shutil.copyfile(log, log.with_suffix(".1"))
        os.truncate(log, 0)
    elif how == "delete":
        log.unlink()


def judged_while_it_steps(tmp_path: Path, how: str, after_checks: int, busy: bool) -> None:
    with making(tmp_path) as made:
        if how == "pipe":
            t = launched(made, tmp_path, "{python} -u {trainer} 2>&1 | grep -v Warning", STEP_EVERY="0.5", BUSY="1")
            results = checks(t, 4)
        else:
            t = launched(made, tmp_path, STEP_EVERY="0.3", BUSY="1" if busy else "0")
            first = wait_for(lambda: (r := check_health.fn(t)).diagnosis.verdict is Verdict.HEALTHY and r, 30, "a healthy run")
            results = [first, *(check_health.fn(t) for _ in range(after_checks))]
            rotate(recorded_log(t), how)
            results += checks(t, 3)
            assert results[-1].diagnosis.metrics.last_step > first.diagnosis.metrics.last_step, verdicts(results)
        never_stalled(results)
        for r in results:
            assert remedy(r.diagnosis).action is Action.NONE or r.diagnosis.watching, verdicts(results)


@settings(max_examples=5, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    how=st.sampled_from(["rename", "create", "copytruncate", "delete", "pipe"]),
    after_checks=st.integers(0, 2),
    busy=st.booleans(),
)
def test_a_stepping_trainer_whose_log_is_rotated_or_piped_is_never_stalled_nor_stopped(tmp_path_factory, how, after_checks, busy):
    judged_while_it_steps(tmp_path_factory.mktemp(how), how, after_checks, busy)


@pytest.mark.parametrize("how", ["copytruncate"])
def test_under_load_a_rotated_log_gives_the_same_verdicts(cpu_hogs, tmp_path, how):
    judged_while_it_steps(tmp_path, how, 1, True)
