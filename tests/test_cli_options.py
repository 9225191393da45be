"""The CLI a person expects: help on every option, choices as enums, completion on, and a question on a terminal
before `stop` (never in a script)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import click
import typer.main

from relaunch.cli.app import app
from relaunch.cli.demo import Scenario
from relaunch.demo.scenarios import SCENARIOS
from relaunch.tasks.launch import launch
from relaunch.testing.faults import cli_env, wait_for, write_target
from relaunch.testing.targets import shell_target, stop_all, tmux_alive

RELAUNCH = str(Path(sys.executable).parent / "relaunch")


def commands(group: click.Command, prefix: str = "relaunch") -> list[tuple[str, click.Command]]:
    found = [(prefix, group)]
    for name, sub in getattr(group, "commands", {}).items():
        found += commands(sub, f"{prefix} {name}")
    return found


def test_every_option_of_every_command_says_what_it_does_and_completion_can_be_installed():
    root = typer.main.get_command(app)
    missing = [f"{name} {p.opts[0]}" for name, cmd in commands(root) for p in cmd.params if isinstance(p, click.Option) and not p.help]
    assert not missing, f"options without help text: {missing}"
    assert "--install-completion" in [o for p in root.params for o in p.opts]
    assert [s.value for s in Scenario] == list(SCENARIOS)


def on_a_terminal(argv: list[str], answer: bytes | None, env: dict[str, str]) -> tuple[int, str]:
    """ARGV with a pseudo-terminal as its input and output, answering its question with ANSWER (if one is given)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    seen = b""
    asked = False
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
        if answer is not None and not asked and b"[y/N]" in seen:
            os.write(leader, answer)
            asked = True
    os.close(leader)
    return proc.wait(timeout=120), seen.decode(errors="replace")


def test_stop_asks_on_a_terminal_and_a_no_leaves_the_trainer_running(tmp_path):
    target = shell_target(tmp_path / "t", name="asked")
    path = write_target(target, tmp_path / "target.yaml")
    env = {**os.environ, "HOME": str(tmp_path)}
    try:
        launch.fn(target, 1)
        wait_for(lambda: tmux_alive(target.tmux_session), 30, "the trainer's session")
        code, said = on_a_terminal([RELAUNCH, "stop", str(path)], b"n\n", env)
        assert code == 1 and "Stop asked" in said and "nothing done" in said, said
        assert tmux_alive(target.tmux_session), "a no stops nothing"
        code, said = on_a_terminal([RELAUNCH, "stop", str(path)], b"y\n", env)
        assert code == 0 and not tmux_alive(target.tmux_session), said
        # Not a terminal (a script, cron): no question, as before.
        launch.fn(target, 2)
        wait_for(lambda: tmux_alive(target.tmux_session), 30, "the trainer's session")
        out = subprocess.run(
            [RELAUNCH, "stop", "--json", str(path)], env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
        )
        assert out.returncode == 0 and '"exit_code": 0' in out.stdout and not tmux_alive(target.tmux_session), out.stdout + out.stderr
    finally:
        stop_all(target)


def test_recover_on_a_terminal_spins_through_its_steps_with_the_flow_runs_link_and_piped_prints_no_spinner(tmp_path, prefect_harness):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    target = shell_target(tmp_path / "t", name="spun")
    path = write_target(target, tmp_path / "target.yaml")
    # Wide enough that the spinner's one line holds the step and the whole link.
    env = cli_env(tmp_path / "home", PREFECT_API_URL.value(), COLUMNS="300")
    try:
        code, said = on_a_terminal([RELAUNCH, "recover", str(path)], None, env)
        assert code == 0, said
        # A step shorter than one refresh of the spinner (a tenth of a second here) may never be drawn: what is drawn must
        # be the recovery's own steps, several of them, and the health check, which polls for seconds.
        shown = set(re.findall(r" {3}(\w+)@localhost {3}", said))
        steps = {
            "preflight",
            "stop_leftovers",
            "check_health",
            "build_venv",
            "stop",
            "rebuild_venv",
            "restore_code",
            "warm_cache",
            "launch",
        }
        assert "check_health" in shown and len(shown) >= 3 and shown <= steps, f"steps on the spinner: {sorted(shown)}: {said!r}"
        ui = PREFECT_API_URL.value().removesuffix("/api")
        links = set(re.findall(re.escape(ui) + r"/runs/flow-run/([0-9a-f-]{36})", said))
        assert len(links) == 1, said
        with get_client(sync_client=True) as client:
            assert client.read_flow_run(links.pop()).name, "the link is the recovery's own flow run"
        assert "\x1b[?25l" in said and "\x1b[?25h" in said, "the spinner hides the cursor while it spins, and gives it back"
        # Prefect's log lines go above the spinner: each starts a line (after the spinner's line is erased), none is glued to it.
        glued = re.findall(r"(.{20})\d\d:\d\d:\d\d\.\d{3} \|", said)
        assert glued and all(before.endswith(("\n", "\x1b[2K")) for before in glued), [
            b for b in glued if not b.endswith(("\n", "\x1b[2K"))
        ]
        # The same command piped (a script, cron): the output as before, not one spinner byte.
        out = subprocess.run([RELAUNCH, "recover", str(path)], env=env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        assert out.returncode == 0, out.stdout + out.stderr
        assert b"verdict: " in out.stdout and not any(mark in out.stdout + out.stderr for mark in (b"\r", b"\x1b")), out.stderr
    finally:
        stop_all(target)


def test_the_spinner_writes_only_when_stdout_is_a_terminal_too_and_when_narrow_drops_the_flows_name_not_the_link(monkeypatch):
    import select
    from uuid import UUID

    from prefect.settings import PREFECT_UI_URL, temporary_settings

    from relaunch.cli import spinner
    from relaunch.tasks.common import STEP_WATCHERS

    leader, follower = pty.openpty()
    run = UUID("de7241bc-ba5a-4c3c-88f3-ca14150d7117")
    link = f"http://ui.example:4200/runs/flow-run/{run}"
    monkeypatch.setattr(spinner, "stream_handlers", lambda fds: [])  # this process's log handlers write to pytest's capture
    monkeypatch.setenv("COLUMNS", str(len(f"stop@gpu1   {link}") + 2))

    def shown(stdout_on_terminal: bool) -> bytes:
        monkeypatch.setattr(sys, "stderr", open(follower, "w", closefd=False))
        monkeypatch.setattr(sys, "stdout", open(follower if stdout_on_terminal else os.devnull, "w", closefd=not stdout_on_terminal))
        with temporary_settings({PREFECT_UI_URL: "http://ui.example:4200"}), spinner.spinning("recover-training", as_json=False):
            for watch in STEP_WATCHERS:
                watch("stop@gpu1", run)
        sys.stderr.flush()
        seen = b""
        while select.select([leader], [], [], 0)[0]:
            seen += os.read(leader, 65536)
        return seen

    on_terminal = shown(stdout_on_terminal=True)
    assert f"stop@gpu1   {link}".encode() in on_terminal and b"recover-training   stop" not in on_terminal, on_terminal
    assert shown(stdout_on_terminal=False) == b"", (
        "stdout piped (`relaunch recover t.yaml | tee`): no spinner, even with stderr on the terminal"
    )
    os.close(leader)
    os.close(follower)
