"""A check of a target whose repo_dir is not there says so, instead of a bare `unknown`."""

from __future__ import annotations

import shutil

from relaunch.judging.diagnosis import diagnose
from relaunch.tasks.health import collect_snapshot
from relaunch.testing.targets import shell_target
from relaunch.vocabulary import Verdict


def test_a_never_launched_target_whose_repo_dir_is_gone_is_unknown_naming_the_missing_folder(tmp_path):
    target = shell_target(tmp_path)
    shutil.rmtree(target.repo_dir)
    d = diagnose(collect_snapshot(target, wait_seconds=0), target.thresholds)
    assert d.verdict is Verdict.UNKNOWN and f"repo_dir {target.repo_dir} does not exist" in d.summary, d


def test_a_never_launched_target_with_its_repo_dir_is_plainly_unknown(tmp_path):
    target = shell_target(tmp_path)
    d = diagnose(collect_snapshot(target, wait_seconds=0), target.thresholds)
    assert d.verdict is Verdict.UNKNOWN and d.summary == "no trainer on record", d
