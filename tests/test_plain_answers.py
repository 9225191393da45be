"""What a person reads when the Prefect API is down, and when a check only looks (issue 45).

A configured Prefect API where nothing listens makes every command that talks to it say which URL does not answer and
how to start one or point at one, exit 2 (it was `unexpected error: ConnectError ... report it if it looks like a bug`,
exit 3). A check without --recover says what it would do and that nothing was done. The CLI as typed from a plain
shell, real trainers in tmux, the session's real Prefect server where a check needs one.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from relaunch.tasks.launch import launch
from relaunch.testing.faults import write_target
from relaunch.testing.sshd import free_port
from relaunch.testing.targets import current, runs, wait_for_exit
from tests.typed_cli import home, made, typed  # noqa: F401 - fixtures shared with the other CLI-as-typed tests


@pytest.mark.parametrize("command", ["status", "check", "goodput", "gpus", "deploy"])
def test_a_prefect_api_where_nothing_listens_is_named_with_how_to_start_one_and_exits_2(made, home, command):
    target = write_target(made(), home / "target.yaml")
    api = f"http://127.0.0.1:{free_port()}/api"
    args = {"status": [str(target)], "check": [str(target)], "goodput": ["t"], "gpus": [], "deploy": [str(target)]}[command]
    done = typed([command, *args], home, api)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unexpected error" not in done.stderr and "Traceback" not in done.stderr and "report it" not in done.stderr, done.stderr
    said, todo = done.stderr.strip().splitlines()[-2:]
    assert said.startswith(f"relaunch: the Prefect API at {api} cannot be reached: ConnectError: "), said
    assert todo.startswith("  what to do: start that server (`make serve` in a clone of relaunch, or `prefect server start`)"), todo
    assert "point PREFECT_API_URL at one that answers" in todo and "`prefect config view`" in todo, todo
    if command == "status":  # what the host knows is still shown
        assert done.stdout.splitlines()[1].split()[2:4] == ["not", "launched"], done.stdout
    print(f"\n{command}: {said}\n{todo}")


def test_json_gives_the_url_that_does_not_answer_and_what_to_do(made, home):
    import json

    target = write_target(made(), home / "target.yaml")
    api = f"http://127.0.0.1:{free_port()}/api"
    done = typed(["check", "--json", str(target)], home, api)
    answer = json.loads(done.stdout)
    assert done.returncode == 2 == answer["exit_code"] and answer["error"] == "api_unanswered" and answer["api_url"] == api, answer
    assert "cannot be reached" in answer["message"] and answer["what_to_do"].startswith("start that server"), answer


def test_a_check_without_recover_says_what_it_would_do_and_that_nothing_was_done(made, home, prefect_harness):
    from prefect.settings import PREFECT_API_URL

    t = made()
    launch.fn(t, 1)
    run = Path(t.state_path) / "runs" / current(t)
    os.kill(int((run / "pid").read_text().split()[0]), signal.SIGKILL)
    wait_for_exit(t)
    before = runs(t)

    done = typed(["check", str(write_target(t, home / "target.yaml"))], home, PREFECT_API_URL.value())
    assert done.returncode == 1, done.stdout + done.stderr
    attempt, verdict = done.stdout.strip().splitlines()
    assert attempt.startswith("attempt 1: crashed (killed) -> would do relaunch (nothing done)"), attempt
    assert not re.search(r"-> relaunch\b", done.stdout), "a check that only looked reads as if it relaunched"
    assert verdict.startswith("verdict: crashed (killed): killed by SIGKILL; nothing was done: not asked to recover "), verdict
    assert "(run `relaunch recover` or `check --recover`)" in verdict and "would do: " in verdict, verdict
    assert runs(t) == before and (run / "exit_code").read_text().strip() == "137", "the check launched nothing"
    print(f"\n{attempt}\n{verdict}")
