"""The reproductions of issue 14, each against the real thing: tmux, git, uv venvs, files, the CLI as a process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from relaunch.judging.diagnosis import diagnose
from relaunch.tasks.health import collect_snapshot, poll_until_settled
from relaunch.tasks.launch import launch
from relaunch.tasks.rebuild_venv import rebuild_venv
from relaunch.tasks.stop import stop
from relaunch.tasks.warm_cache import warm_cache
from relaunch.testing.faults import BAD_INPUT, LOST, MID_STEP, RELAUNCH, ROOT, case, cli_env, making, tree, wait_for
from relaunch.testing.targets import shell_target, wait_for_exit

# Resumes from a checkpoint folder: reads (never writes) the step it records.
RESUME_SH = """#!/usr/bin/env bash
start=0
[ -n "$1" ] && start=$(cat "$1/step")
exec bash stepper.sh "$start"
"""


@pytest.fixture
def made(tmp_path):
    with making(tmp_path) as make:
        yield make


def checkpoints(target, *names: str) -> None:
    for name in names:
        folder = Path(target.checkpoint_dir) / name
        folder.mkdir(parents=True)
        (folder / "step").write_text(str(int(name.rsplit("_", 1)[-1], 10)) + "\n")


def with_resume_script(target) -> None:
    from relaunch.demo.target import git

    (Path(target.repo_dir) / "resume.sh").write_text(RESUME_SH)
    git(Path(target.repo_dir), "add", "resume.sh")
    git(Path(target.repo_dir), "commit", "-q", "-m", "resume")


@case(
    LOST,
    "checkpoints named `step_000700`, `step_000800`, `step_000900` (bash once read them as octal and resumed from 700)",
    "the relaunch resumes from `step_000900`, chosen in Python (base 10) from a NUL-separated listing; the run record says why",
)
def test_zero_padded_checkpoints_resume_from_the_highest_step_not_an_octal_misreading(made):
    t = made(launch_command="bash resume.sh")
    with_resume_script(t)
    checkpoints(t, "step_000700", "step_000800", "step_000900")
    record, _ = launch.fn(t, 1)
    assert record.checkpoint == f"{t.checkpoint_dir}/step_000900", record.checkpoint_why
    assert "highest step (900)" in record.checkpoint_why
    assert poll_until_settled(t).diagnosis.metrics.last_step > 900


@case(LOST, "`checkpoint_dir` that does not exist", "the launch says so (warning and run record) and starts from scratch")
def test_a_missing_checkpoint_dir_is_said_and_the_run_starts_from_scratch(made):
    t = made()
    record, _ = launch.fn(t, 1)
    assert record.checkpoint is None and "does not exist" in record.checkpoint_why


def cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([RELAUNCH, *args], env=cli_env(tmp_path / "home"), capture_output=True, text=True, timeout=120, cwd=ROOT)


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@case(
    BAD_INPUT,
    "`inductor_cache_dir` set to the checkpoint folder, to it through `..`, or to `/tmp/../usr`",
    "`relaunch recover` exits 2 naming `inductor_cache_dir`; checkpoints identical, nothing ran",
)
def test_a_cache_dir_set_to_the_checkpoint_folder_is_refused_before_anything_runs(made, tmp_path):
    t = made()
    checkpoints(t, "step_100", "step_600")
    before = tree(Path(t.checkpoint_dir))
    for cache in (t.checkpoint_dir, f"{t.checkpoint_dir}/../{Path(t.checkpoint_dir).name}", "/tmp/../usr"):
        result = cli(["recover", str(write(tmp_path, {**t.model_dump(mode="json"), "inductor_cache_dir": cache}))], tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "inductor_cache_dir" in result.stderr and "Traceback" not in result.stderr
    assert tree(Path(t.checkpoint_dir)) == before
    assert not Path(t.state_path).exists(), "nothing ran"


@case(
    LOST,
    "`inductor_cache_dir` a symbolic link to the checkpoint folder (validation cannot see links)",
    "the link is moved aside and kept, never followed; every checkpoint identical; a fresh cache folder takes its place",
)
def test_a_cache_dir_that_links_to_the_checkpoints_is_moved_aside_and_nothing_behind_it_is_deleted(made):
    t = made()
    checkpoints(t, "step_100", "step_600")
    before = tree(Path(t.checkpoint_dir))
    Path(t.inductor_cache_dir).symlink_to(t.checkpoint_dir)
    step = warm_cache.fn(t)
    assert tree(Path(t.checkpoint_dir)) == before
    kept = Path(step.detail.kept_aside)
    assert kept.is_symlink() and kept.resolve() == Path(t.checkpoint_dir).resolve()
    assert Path(t.inductor_cache_dir).is_dir() and not Path(t.inductor_cache_dir).is_symlink()


@case(
    LOST,
    "a cache folder holding a file that is not compile cache",
    "the cache is moved aside whole and kept (named in the report), never `rm -rf`",
)
def test_a_cache_holding_files_that_are_not_compile_cache_is_kept_aside_whole(made):
    t = made()
    cache = Path(t.inductor_cache_dir)
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / "cab.so").write_text("kernel")
    (cache / "my-notes.txt").write_text("not a kernel")
    step = warm_cache.fn(t)
    kept = Path(step.detail.kept_aside)
    assert (kept / "my-notes.txt").read_text() == "not a kernel" and (kept / "ab" / "cab.so").exists()
    assert not (cache / "ab").exists()


@case(
    LOST,
    "the compile cache shared with another job, which holds one of its kernels open while the recovery re-warms it",
    "the cache is moved aside, never removed while in use: kept (named in the report, the PID said), the other job's file intact",
)
def test_a_cache_another_process_has_open_is_moved_aside_and_kept_never_removed(made):
    t = made()
    cache = Path(t.inductor_cache_dir)
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / "cab.so").write_text("kernel")
    other = subprocess.Popen(
        ["bash", "-c", 'exec 3< "$1"; read -r _ < /dev/stdin', "other-job", str(cache / "ab" / "cab.so")], stdin=subprocess.PIPE
    )
    try:
        wait_for(
            lambda: any(os.path.realpath(f"/proc/{other.pid}/fd/{fd}").endswith("cab.so") for fd in os.listdir(f"/proc/{other.pid}/fd")),
            10,
            "the other job to open the kernel",
        )
        step = warm_cache.fn(t)
        kept = Path(step.detail.kept_aside)
        assert (kept / "ab" / "cab.so").read_text() == "kernel", "a cache in use by another process is kept aside, never removed"
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
    assert not (cache / "ab").exists(), "the target's own cache is fresh"


@case(
    BAD_INPUT,
    '`venv_dir: "/x/precious\\nx/venv"` with `keep_old_venvs: 1` (once deleted /x/precious)',
    "exit 2 naming `venv_dir` and its control character; /x/precious intact",
)
def test_a_venv_path_with_a_newline_is_refused_and_nothing_is_pruned(made, tmp_path):
    t = made()
    precious = tmp_path / "x" / "precious"
    precious.mkdir(parents=True)
    (precious / "data").write_text("irreplaceable")
    data = {**t.model_dump(mode="json"), "venv_dir": f"{tmp_path}/x/precious\nx/venv", "keep_old_venvs": 1}
    result = cli(["recover", str(write(tmp_path, data))], tmp_path)
    assert result.returncode == 2 and "venv_dir" in result.stderr and "control characters" in result.stderr
    assert (precious / "data").read_text() == "irreplaceable"


@case(
    LOST,
    "old venvs whose names hold a newline, quotes and `$(...)`, beside an unrelated folder",
    "the prune removes exactly the `VENV.old-*` names beyond the newest, chosen in Python; the unrelated folder intact",
)
def test_pruning_removes_only_old_venvs_by_their_exact_names(made, tmp_path):
    t = made(keep_old_venvs=1)
    parent = Path(t.venv_dir).parent
    odd = ["venv.old-20200101T000000.000000Z", "venv.old-0\nprecious", "venv.old-1 'quoted' $(touch x)"]
    for name in odd:
        (parent / name).mkdir()
        (parent / name / "f").write_text("old")
    (parent / "precious").mkdir()
    (parent / "precious" / "data").write_text("irreplaceable")
    subprocess.run(["uv", "venv", "-q", "--python", t.python, t.venv_dir], check=True)
    step = rebuild_venv.fn(t)
    assert sorted(Path(p).name for p in step.detail.pruned) == sorted(odd)
    assert (parent / "precious" / "data").read_text() == "irreplaceable" and not (parent / "x").exists()
    assert len(list(parent.glob("venv.old-*"))) == 1, "the newest old venv is kept"


@case(
    BAD_INPUT,
    'a `repo_dir` holding `" ; } ; touch PWNED ; false && { : "` and an env value holding `$(...)`, backticks, quotes and a newline',
    "nothing runs: the trainer starts in that folder and gets the value byte for byte through its environment",
)
def test_config_values_never_run_as_shell_code_in_the_supervisor(tmp_path):
    evil = '" ; } ; touch PWNED ; false && { : "'
    t = shell_target(
        tmp_path / evil,
        env={"V": "$(touch PWNED2) `touch PWNED3` \"q\" 'q'\nline2"},
        launch_command='printf "%s" "$V" > env-seen; bash stepper.sh',
    )
    try:
        launch.fn(t, 1)
        assert poll_until_settled(t).diagnosis.verdict.value == "healthy"
        assert (Path(t.repo_dir) / "env-seen").read_text() == t.env["V"], "the value reached the trainer byte for byte"
        assert not list(tmp_path.rglob("PWNED*")) and not list(Path("/").glob("PWNED*"))
    finally:
        stop.fn(t)


@case(BAD_INPUT, "an env key `A; touch /tmp/x; B`", "exit 2 naming `env`: keys must be shell variable names")
def test_an_env_key_that_is_not_a_shell_name_is_refused(tmp_path):
    t = shell_target(tmp_path / "t")
    result = cli(["recover", str(write(tmp_path, {**t.model_dump(mode="json"), "env": {"A; touch /tmp/x; B": "1"}}))], tmp_path)
    assert result.returncode == 2 and "env" in result.stderr and "not a shell variable name" in result.stderr


def test_a_fractional_poll_interval_waits_that_long_on_the_host(made):
    t = made()
    launch.fn(t, 1)
    import time

    start = time.monotonic()
    snap = collect_snapshot(t, wait_seconds=0.6)
    assert snap.pid_alive and time.monotonic() - start >= 0.55, "a 0.6 s poll waited on the host, not 0 s"


LOGS = Path(__file__).parent / "fixtures" / "logs"


@case(
    MID_STEP,
    "a trainer whose output is a real rich-coloured traceback, and one whose tqdm bar redraws step lines with `\\r` (both captured, tests/fixtures/logs)",
    "through the host poll: the coloured exception line is the cause (not 'exited 1 without a traceback'), and the run is judged on its newest step (164, not a stale 159)",
)
def test_the_poll_reads_through_colour_codes_and_carriage_return_redraws(made):
    coloured = made(launch_command=f"cat {LOGS / 'ansi_colored_traceback.log'}; exit 1")
    redrawn = made(launch_command=f"cat {LOGS / 'carriage_return_progress.log'}; exit 1")
    for t in (coloured, redrawn):
        launch.fn(t, 1)
        wait_for_exit(t)
    d = diagnose(collect_snapshot(coloured), coloured.thresholds)
    assert d.cause is not None and d.cause.value == "error", d
    assert any(e.startswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied") for e in d.evidence), d.evidence
    assert diagnose(collect_snapshot(redrawn), redrawn.thresholds).metrics.last_step == 164
