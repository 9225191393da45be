"""A repo in the middle of a git operation is refused by restore_code, named, and its conflicted file is left as it is.

Real git: each operation is started for real and stopped by a real conflict in model.py (a restore path).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from relaunch.errors import CommandFailed
from relaunch.tasks.restore_code import check_restorable, restore_code
from relaunch.testing.targets import shell_target

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t.invalid"}


def git(repo: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, **GIT_ENV, "GIT_EDITOR": "true"}
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, env=env, check=check)


def commit_model(repo: str, value: str) -> None:
    (Path(repo) / "model.py").write_text(f"VALUE = {value}\n")
    git(repo, "commit", "-q", "-am", f"value {value}")


def diverged(repo: str) -> None:
    """Branch `side` sets VALUE = 2, main sets VALUE = 3: any operation joining them conflicts in model.py."""
    git(repo, "checkout", "-q", "-b", "side")
    commit_model(repo, "2")
    git(repo, "checkout", "-q", "main")
    commit_model(repo, "3")


def start(repo: str, operation: str) -> None:
    """Start `operation` for real; it stops on the conflict in model.py."""
    if operation == "rebase":
        git(repo, "checkout", "-q", "side")
        joined = git(repo, "rebase", "main", check=False)
    elif operation == "merge":
        joined = git(repo, "merge", "side", check=False)
    elif operation == "cherry-pick":
        joined = git(repo, "cherry-pick", "side", check=False)
    elif operation == "revert":
        commit_model(repo, "4")  # reverting "value 3" conflicts with "value 4" on top of it
        joined = git(repo, "revert", "--no-edit", "HEAD~1", check=False)
    else:  # a conflict from `git stash pop`: unmerged files, no operation in progress
        (Path(repo) / "model.py").write_text("VALUE = 5\n")
        git(repo, "stash", "-q")
        commit_model(repo, "6")
        joined = git(repo, "stash", "pop", check=False)
    assert joined.returncode != 0 and "CONFLICT" in joined.stdout + joined.stderr, joined


@pytest.mark.parametrize(
    "operation, named, finish",
    [
        ("rebase", "in the middle of a git rebase", "git rebase --continue"),
        ("merge", "in the middle of a git merge", "git commit"),
        ("cherry-pick", "in the middle of a git cherry-pick", "git cherry-pick --continue"),
        ("revert", "in the middle of a git revert", "git revert --continue"),
        ("stash pop", "has unmerged files", "resolve them"),
    ],
)
def test_a_repo_mid_operation_is_refused_named_with_what_to_do_and_its_conflicted_file_is_unchanged(tmp_path, operation, named, finish):
    t = shell_target(tmp_path)
    diverged(t.repo_dir)
    start(t.repo_dir, operation)
    model = Path(t.repo_dir) / "model.py"
    conflicted = model.read_bytes()
    assert b"<<<<<<<" in conflicted, "the operation stopped on a real conflict"
    status = git(t.repo_dir, "status", "--porcelain=v2").stdout
    for attempt in (lambda: check_restorable(t), lambda: restore_code.fn(t)):
        with pytest.raises(CommandFailed) as err:
            attempt()
        text = str(err.value)
        assert err.value.exit_code == 40 and t.host.label in text, text
        assert named in text and "model.py" in text, text
        assert operation == "stash pop" or "with conflicts in: model.py" in text, text
        assert finish in text and "nothing was restored" in text, text
        if operation != "stash pop":
            assert f"git {operation} --abort" in text, text
        assert model.read_bytes() == conflicted, "the conflicted file is exactly as the person left it"
        assert git(t.repo_dir, "status", "--porcelain=v2").stdout == status, "the index and worktree are untouched"
    assert not (Path(t.state_path) / "patches").exists(), "no patch: nothing was about to be dropped"


def test_a_clean_repo_is_restorable_and_the_check_writes_nothing(tmp_path):
    t = shell_target(tmp_path)
    model = Path(t.repo_dir) / "model.py"
    model.write_text("VALUE = 2  # hack\n")
    check_restorable(t)
    assert model.read_text() == "VALUE = 2  # hack\n" and not (Path(t.state_path) / "patches").exists()
    step = restore_code.fn(t)
    assert model.read_text() == "VALUE = 1\n" and step.detail.patch
