"""The CLI as a person types it: a plain shell's PATH, real processes, exit codes that mean one thing each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from relaunch.tasks.launch import launch
from relaunch.testing.faults import ROOT, write_target
from relaunch.testing.targets import shell_target, stop_all, tmux_alive, wait_for_exit

RELAUNCH = str(Path(sys.executable).parent / "relaunch")
LOGS = ROOT / "tests" / "fixtures" / "logs"


def plain_env(home: Path, **extra: str) -> dict[str, str]:
    """What `env -i HOME=... PATH=/usr/bin:/bin` gives: no venv on PATH, no Prefect settings."""
    return {"HOME": str(home), "PATH": "/usr/bin:/bin", "PREFECT_HOME": str(home / ".prefect"), **extra}


def typed(args: list[str], home: Path, timeout: float = 180, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([RELAUNCH, *args], env=plain_env(home, **extra), capture_output=True, text=True, timeout=timeout, cwd=home)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def test_version_and_help_say_what_they_should(home):
    version = typed(["--version"], home)
    assert version.returncode == 0 and version.stdout.startswith("relaunch ")
    text = typed(["--help"], home).stdout
    assert "Exit codes: 0 healthy" in " ".join(text.split()) and "3 an unexpected error" in " ".join(text.split())
    for command in ("demo", "diagnose", "check", "recover", "stop", "logs", "fleet", "rollback-venv"):
        assert command in text


@pytest.mark.parametrize(
    ("fixture", "options", "code"),
    [
        ("cpu/generic_error.log", ["--exit-code", "1"], 1),
        ("gpu/flex_compiled.log", ["--running", "--seconds-since-log-write", "1"], 0),
    ],
)
def test_diagnose_exits_1_for_a_sick_run_and_0_for_a_healthy_one(home, fixture, options, code):
    assert typed(["diagnose", str(LOGS / fixture), *options], home).returncode == code


def test_a_bad_target_file_exits_2_with_one_clean_line(home):
    bad = home / "target.yaml"
    bad.write_text("name: x\nrepo_dir: relative\n")
    result = typed(["check", str(bad)], home)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert str(bad) in result.stderr and "repo_dir" in result.stderr


def test_an_unexpected_error_is_one_line_and_exit_3_and_debug_shows_the_traceback(home, tmp_path):
    import http.server
    import threading

    target = write_target(shell_target(tmp_path / "t"), home / "target.yaml")
    # A web server that is no Prefect API (404 for every path) where the API should be: a real failure that is not
    # relaunch's own error class (Prefect's `RuntimeError: Failed to reach API`, over an HTTP 404), and no connection
    # refused (a Prefect API that cannot be reached is said as that, exit 2: tests/test_plain_answers.py).
    empty = tmp_path / "empty"
    empty.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(empty)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api = f"http://127.0.0.1:{server.server_address[1]}/api"
    try:
        plain = typed(["check", str(target)], home, PREFECT_API_URL=api)
        assert plain.returncode == 3, plain.stderr
        assert "relaunch: unexpected error:" in plain.stderr and "--debug" in plain.stderr and "Traceback" not in plain.stderr
        debug = typed(["--debug", "check", str(target)], home, PREFECT_API_URL=api)
        assert debug.returncode == 3 and "Traceback (most recent call last)" in debug.stderr
    finally:
        server.shutdown()
        server.server_close()


def test_check_stop_and_logs_work_as_typed_from_a_plain_shell(home, tmp_path):
    t = shell_target(tmp_path / "t", name="typed")
    target = write_target(t, home / "target.yaml")
    try:
        recovered = typed(["recover", str(target)], home)
        assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        assert "verdict: healthy" in recovered.stdout
        logs = typed(["logs", str(target), "-n", "2"], home)
        assert logs.returncode == 0 and len(logs.stdout.splitlines()) == 2 and logs.stdout.startswith("step=")
        checked = typed(["check", str(target)], home)
        assert checked.returncode == 0 and "healthy" in checked.stdout
        stopped = typed(["stop", str(target)], home)
        assert stopped.returncode == 0 and "stopped (" in stopped.stdout
        assert not tmux_alive(t.tmux_session)
        after = typed(["check", str(target)], home)
        assert after.returncode == 0 and "stopped" in after.stdout, "a run a person stopped is said to be stopped on purpose, not crashed"
        nightly = typed(["check", "--recover", str(target)], home)
        assert nightly.returncode == 0 and "stopped" in nightly.stdout and not tmux_alive(t.tmux_session), (
            "the nightly check leaves it stopped"
        )
    finally:
        stop_all(t)


def test_logs_follow_prints_new_lines_and_ends_quietly_when_the_reader_leaves(home, tmp_path):
    t = shell_target(tmp_path / "t", name="follow")
    target = write_target(t, home / "target.yaml")
    try:
        launch.fn(t, 1)
        proc = subprocess.Popen(
            f"{RELAUNCH} logs -f -n 1 {target} | head -n 5",
            shell=True,
            env=plain_env(home),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = proc.communicate(timeout=60)
        steps = [int(line.split()[0].split("=")[1]) for line in out.splitlines()]
        assert len(steps) == 5 and steps == sorted(steps) and steps[-1] > steps[0], out
        assert "Traceback" not in err and "Broken pipe" not in err, err
    finally:
        stop_all(t)


def test_check_with_recover_recovers_a_crashed_run_as_the_nightly_check_does(home, tmp_path):
    t = shell_target(tmp_path / "t", name="nightly")
    target = write_target(t, home / "target.yaml")
    try:
        launch.fn(t.model_copy(update={"env": {"EXIT_AT": "2", "EXIT_CODE": "3"}}), 1)
        wait_for_exit(t)
        result = typed(["check", "--recover", str(target)], home)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "check found crashed" in result.stdout and "verdict: healthy" in result.stdout
    finally:
        stop_all(t)


def test_fleet_checks_every_target_of_a_fleet_file_and_exits_1_when_one_is_sick(home, tmp_path):
    ok, sick = shell_target(tmp_path / "ok", name="ok"), shell_target(tmp_path / "sick", name="sick")
    write_target(ok, home / "ok.yaml")
    write_target(sick, home / "sick.yaml")
    (home / "fleet.yaml").write_text("targets: [ok.yaml, sick.yaml]\nmax_concurrent: 2\n")
    try:
        launch.fn(ok, 1)
        result = typed(["fleet", "--check-only", str(home / "fleet.yaml")], home)
        assert result.returncode == 1, result.stdout + result.stderr
        rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.split() and line.split()[0] in ("ok", "sick")}
        assert "healthy" in rows["ok"] and "unknown" in rows["sick"], result.stdout
    finally:
        stop_all(ok, sick)


def test_the_demo_writes_its_target_file_and_says_how_to_check_it(home):
    result = typed(["demo", "--scenario", "healthy", "--workdir", str(home / "demo")], home, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    target = home / "demo" / "healthy" / "target.yaml"
    assert target.exists() and f"check {target}" in result.stdout and f"stop {target}" in result.stdout
    assert result.stdout.startswith("attempt 1: unknown -> full_recovery") and "verdict: healthy" in result.stdout, result.stdout
    checked = typed(["check", str(target)], home)
    assert checked.returncode == 0 and "verdict: stopped" in checked.stdout, "the demo's own stop at the end is recorded as deliberate"


def test_recover_dry_run_prints_every_step_of_the_full_procedure_and_runs_nothing(home, tmp_path):
    t = shell_target(tmp_path / "t", name="dry")
    result = typed(["recover", "--dry-run", str(write_target(t, home / "target.yaml"))], home)
    assert result.returncode == 0, result.stderr
    steps = [line.split(":")[0].removeprefix("# ") for line in result.stdout.splitlines()[2:] if line.startswith("# ")]
    assert steps[0] == "preflight" and steps[-1] == "launch" and {"stop", "rebuild_venv", "restore_code", "warm_cache"} <= set(steps)
    assert "<relaunch/host/launch.sh>" in result.stdout and "uv pip sync" in result.stdout
    assert not Path(t.state_path).exists() and not Path(t.venv_dir).exists(), "a dry run changes nothing"


def test_goodput_with_no_api_configured_uses_relaunchs_temporary_server_not_prefects_ephemeral_one(home):
    # Prefect's own ephemeral server (what goodput got before) gives up when its start takes longer than its timeout:
    # on a loaded host it ended `unexpected error: RuntimeError: Timed out while attempting to connect to ephemeral
    # Prefect API server`, exit 3 (seen 2026-12-04, the README's command from env -i beside a loaded make test). A
    # timeout of 0 makes that failure certain; relaunch's temporary server (the same database) does not read it.
    env = {"DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "0"}
    out = typed(["goodput", "nobody-here", "--json"], home, **env)
    assert out.returncode == 0, out.stderr
    assert "ephemeral" not in out.stderr and json.loads(out.stdout)["target"] == "nobody-here", out.stderr
