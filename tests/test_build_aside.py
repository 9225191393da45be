"""A rebuild is built aside while the run still runs: a lock that cannot be built leaves the run and its venv as they were.

Real uv venvs from a lock of tiny local wheels (offline), a real bash trainer in real tmux; the trainer's PID
with its start time, its step count and the venv's inode are compared before and after.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from relaunch.demo.wheels import write_wheel
from relaunch.errors import CommandFailed, PreflightFailed
from relaunch.plans.rebuild_venv import BUILDING_MARKER, BUILT_RECORD, aside_path, lock_problems, network_lines
from relaunch.tasks.install_package import install_package
from relaunch.tasks.launch import launch
from relaunch.tasks.rebuild_venv import build_venv, rebuild_venv
from relaunch.tasks.stop import stop
from relaunch.testing.faults import making, start_time, wait_for
from relaunch.testing.targets import current_log, shell_target

STAMP = "20260101T000000.000000Z"


@pytest.fixture
def made(tmp_path):
    with making(tmp_path) as make:
        yield make


def users_venv(target) -> int:
    """The venv the user has: made by uv, marked with a file of theirs; its inode, to tell it from any other."""
    subprocess.run(["uv", "venv", "-q", "--python", target.python, target.venv_dir], check=True)
    (Path(target.venv_dir) / "mine").write_text("the user's venv\n")
    return os.stat(target.venv_dir).st_ino


def steps_logged(target) -> int:
    return len(re.findall(r"^step=\d+", current_log(target).read_text(), re.MULTILINE))


def still_stepping(target, pid: int, start: str) -> None:
    """The same process (PID and start time) goes on printing step lines."""
    seen = steps_logged(target)
    wait_for(lambda: steps_logged(target) >= seen + 3, 30, "the trainer to go on stepping")
    assert start_time(pid) == start, "the trainer is the same process as before"


def siblings(target, kind: str) -> list[Path]:
    venv = Path(target.venv_dir)
    return sorted(venv.parent.glob(f"{venv.name}.{kind}-*"))


def cli_wheel(target, name: str) -> None:
    """A wheel with a console script that prints the venv it runs in, into the target's find_links."""
    code = f"def main():\n    import sys\n    print('{name}', sys.prefix)\n".encode()
    entry = f"[console_scripts]\n{name} = {name}:main\n".encode()
    write_wheel(Path(target.find_links[0]), name, "1.0.0", {f"{name}.py": code, f"{name}-1.0.0.dist-info/entry_points.txt": entry})


@pytest.mark.parametrize(
    "bad_line, refused_up_front",
    [("x @ git+https://example.invalid/x.git", True), ("tinyjunk==9.9.9", False)],
    ids=["a git+https line, offline", "a version find_links does not have"],
)
def test_a_lock_that_cannot_be_built_fails_the_build_and_leaves_the_live_trainer_and_its_venv_as_they_were(
    made, bad_line, refused_up_front
):
    t = made()
    inode = users_venv(t)
    record, _ = launch.fn(t, 1)
    start = start_time(record.pid)
    wait_for(lambda: steps_logged(t) >= 2, 30, "the trainer to step")
    Path(t.lock_path).write_text(f"tinyjunk==0.1.0\n{bad_line}\n")
    with pytest.raises(PreflightFailed if refused_up_front else CommandFailed) as err:
        build_venv.fn(t, STAMP)
    text = str(err.value)
    assert t.host.label in text, text
    if refused_up_front:
        # Named before anything is created: which file, which line, why, what to do.
        assert f"{t.lock_path} line 2: `{bad_line}` needs the network" in text and "find_links" in text, text
        assert siblings(t, "new") == siblings(t, "failed") == []
    else:
        # The installer's own words: its command, its exit code, its output, and what to do.
        assert "uv pip sync" in text and "exited 1" in text and "tinyjunk" in text and "the venv in use was not touched" in text, text
        assert [p.name for p in siblings(t, "failed")] == [f"venv.failed-{STAMP}"], "the failed build is kept for a look"
        assert siblings(t, "new") == []
    still_stepping(t, record.pid, start)
    assert os.stat(t.venv_dir).st_ino == inode and (Path(t.venv_dir) / "mine").read_text() == "the user's venv\n"
    assert siblings(t, "old") == [], "the user's venv was not moved"


def test_a_good_lock_is_built_aside_while_the_trainer_runs_and_renamed_into_place_after_the_stop(made):
    t = made()
    cli_wheel(t, "tinycli")
    cli_wheel(t, "tinycli2")
    Path(t.lock_path).write_text("tinyjunk==0.1.0\ntinycli==1.0.0\n")
    inode = users_venv(t)
    record, _ = launch.fn(t, 1)
    start = start_time(record.pid)
    built = build_venv.fn(t, STAMP)
    assert built.detail.built == aside_path(t, STAMP) and built.detail.drift == [] and built.detail.packages == 2
    still_stepping(t, record.pid, start)
    assert os.stat(t.venv_dir).st_ino == inode
    # The swap refuses under the live trainer: it imports from the venv as it goes.
    with pytest.raises(CommandFailed, match=f"PID {record.pid}.*stop it before swapping"):
        rebuild_venv.fn(t, STAMP)
    assert os.stat(t.venv_dir).st_ino == inode and start_time(record.pid) == start
    stop.fn(t)
    swapped = rebuild_venv.fn(t, STAMP)
    venv = Path(t.venv_dir)
    assert swapped.detail.prepared and swapped.detail.packages == 2, "the build aside was swapped in, not built again"
    assert swapped.detail.old_venv == f"{venv}.old-{STAMP}" and (Path(swapped.detail.old_venv) / "mine").exists()
    assert not (venv / "mine").exists() and not (venv / BUILDING_MARKER).exists() and siblings(t, "new") == []
    out = subprocess.run([f"{venv}/bin/python", "-c", "import tinyjunk; print(tinyjunk.__version__)"], capture_output=True, text=True)
    assert (out.returncode, out.stdout.strip()) == (0, "0.1.0"), out.stderr
    # A console script written at VENV.new-STAMP runs from its new name, and so does one installed after the rename.
    assert subprocess.run([f"{venv}/bin/tinycli"], capture_output=True, text=True, check=True).stdout.split() == ["tinycli", str(venv)]
    install_package.fn(t, "tinycli2")
    assert subprocess.run([f"{venv}/bin/tinycli2"], capture_output=True, text=True, check=True).stdout.split() == ["tinycli2", str(venv)]
    # A retry of the swap whose answer was lost: it finds its own work done and changes nothing.
    again = rebuild_venv.fn(t, STAMP)
    assert again.detail.old_venv == swapped.detail.old_venv and os.stat(t.venv_dir).st_ino == os.stat(venv).st_ino
    assert siblings(t, "new") == [] and len(siblings(t, "old")) == 1


def test_builds_that_were_never_swapped_in_are_kept_aside_and_a_retried_build_keeps_its_finished_work(made):
    t = made()
    users_venv(t)
    first = build_venv.fn(t, "A")
    assert build_venv.fn(t, "A").detail.reused, "a retry after a lost answer keeps the finished build"
    assert first.detail.built == aside_path(t, "A")
    half = Path(aside_path(t, "B"))
    half.mkdir()
    (half / BUILDING_MARKER).touch()
    build_venv.fn(t, "C")
    # The next recovery's build keeps the earlier ones aside by what they are, deletes nothing.
    assert [p.name for p in siblings(t, "unused")] == ["venv.unused-A"] and (siblings(t, "unused")[0] / BUILT_RECORD).exists()
    assert [p.name for p in siblings(t, "incomplete")] == ["venv.incomplete-B"]
    assert [p.name for p in siblings(t, "new")] == ["venv.new-C"] and (Path(t.venv_dir) / "mine").exists()


def test_an_offline_lock_line_that_needs_the_network_is_named_and_local_ones_pass(tmp_path):
    lock = (
        "tinyjunk==0.1.0 --hash=sha256:00  # pinned, see https://example.invalid/why\n"
        "x @ git+https://example.invalid/x.git\n"
        "-e git+ssh://git@example.invalid/a/b.git#egg=b\n"
        "y @ https://example.invalid/y-1.0-py3-none-any.whl \\\n"
        "    --hash=sha256:01\n"
        "z @ file:///wheels/z-1.0-py3-none-any.whl\n"
        "w @ git+file:///srv/w\n"
        "--index-url https://example.invalid/simple\n"
        "--find-links https://example.invalid/wheels\n"
        "v @ git+git@example.invalid:a/v.git\n"
    )
    assert [n for n, _ in network_lines(lock)] == [2, 3, 4, 9, 10]
    offline = shell_target(tmp_path)
    assert len(lock_problems(offline, lock)) == 5 and "line 4: `y @ https://" in lock_problems(offline, lock)[2]
    assert lock_problems(offline.model_copy(update={"offline": False}), lock) == [], "online, uv may fetch them"
