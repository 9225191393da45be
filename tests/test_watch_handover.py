"""Issue 50: what the watch hands over. A person's stop is never undone by the watch, in either form of it (a stop is on
record before its first signal, a look reads the stop after the trainer's liveness and exit record, and a recovery the
watch starts leaves a target stopped on purpose stopped); and a death is never lost to a Prefect API that is down (its
handover is retried with backoff until the API answers, said once). Real trainers in tmux, real stops, a real Prefect
server stopped and started again; every wait is on an event (a line said, a file, a FIFO opened), never a fixed time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import httpx
import pytest
import yaml

import relaunch.flows.watch as watching
from relaunch.config import Target
from relaunch.flows.watch import Watch, api_unreachable, look, watch_training
from relaunch.judging.watching import Seen, seen
from relaunch.tasks.launch import launch
from relaunch.tasks.memory import read_handed, write_handed
from relaunch.tasks.stop import stop
from relaunch.testing.faults import start_time, wait_for
from relaunch.testing.targets import current, runs, shell_target, stop_all, tmux_alive
from relaunch.vocabulary import Action, Verdict

BIN = Path(sys.executable).parent
# A trainer that says, on its first SIGTERM, whether the target was already recorded stopped then ($STOPPED_MARK).
HEARS_TERM = """#!/usr/bin/env bash
trap 'if [ -e "$STOPPED_MARK" ]; then echo recorded; else echo unrecorded; fi >> "$HEARD"; exit 143' TERM
echo "step=1 loss=3.6441"
: > "$READY"
while :; do sleep 0.05 & wait $!; done
"""


class Said:
    """What a watch says, line by line; a test waits on a line to be said (a condition, never a sleep)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.changed = threading.Condition()

    def __call__(self, line: str) -> None:
        with self.changed:
            self.lines.append(line)
            self.changed.notify_all()

    def wait(self, *texts: str, timeout: float, since: int = 0) -> str:
        """The first line said from index `since` on that holds any of `texts`."""

        def found() -> str | None:
            return next((line for line in self.lines[since:] if any(t in line for t in texts)), None)

        with self.changed:
            if not self.changed.wait_for(lambda: found() is not None, timeout):
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {texts}; said: {self.lines}")
            line = found()
            assert line is not None
            return line

    def count(self, text: str) -> int:
        with self.changed:
            return sum(text in line for line in self.lines)


def write_target(path: Path, target: Target) -> Path:
    path.write_text(yaml.safe_dump(target.model_dump(mode="json")))
    return path


def stop_again_and_again(target: Target, said: Said, times: int) -> list[str]:
    """`times` times: a launch, the watch seeing its trainer run (a look then held on it), a person's stop; each time the
    watch must call the target idle, never hand the stop's death over. The runs launched, in order."""
    launched = []
    for attempt in range(1, times + 1):
        mark = len(said.lines)
        detail, _ = launch.fn(target, attempt)
        launched.append(detail.run_id)
        said.wait(f"{target.name}: running (run {detail.run_id}", timeout=60, since=mark)
        mark = len(said.lines)
        stop.fn(target, deliberate=True)
        line = said.wait(f"idle (run {detail.run_id}", f"run {detail.run_id} (PID", "recover-training", timeout=60, since=mark)
        assert "idle" in line, f"stop {attempt} of {times}: the watch handed a person's stop over: {said.lines[mark:]}"
        assert start_time(detail.pid) is None and (Path(target.state_path) / "stopped").exists()
    return launched


def never_undone(target: Target, said: Said, launched: list[str]) -> None:
    assert runs(target) == sorted(launched), f"a trainer the test did not launch was started: {runs(target)}; said: {said.lines}"
    # A look in the moment a launch has put its run on record but not yet its trainer reads a death with no PID (a race
    # of its own, not a stop's: seen on a loaded host as `run X (PID None) died, exit code none recorded`); its
    # recovery finds the run starting and does nothing, as the count of runs above says. A stop's death has its PID.
    handed = [line for line in said.lines if "died" in line and "(PID None)" not in line]
    assert not handed, f"a stop's death was handed over: {handed}; said: {said.lines}"
    assert (Path(target.state_path) / "stopped").exists() and not tmux_alive(target.tmux_session), "left stopped"


# ---- a person's stop ---------------------------------------------------------------------------------------------------


def test_a_persons_stop_is_on_record_before_its_trainer_hears_the_first_signal(tmp_path):
    script = tmp_path / "hears_term.sh"
    script.write_text(HEARS_TERM)
    target = shell_target(tmp_path / "t", launch_command=f"bash {script}", stop_grace_seconds=10)
    heard, ready = tmp_path / "heard", tmp_path / "ready"
    target = target.model_copy(
        update={"env": {"STOPPED_MARK": str(Path(target.state_path) / "stopped"), "HEARD": str(heard), "READY": str(ready)}}
    )
    try:
        launch.fn(target, 1)
        wait_for(ready.exists, 30, "the trainer to set its SIGTERM handler")
        detail = stop.fn(target, deliberate=True).detail
        assert heard.read_text().splitlines() == ["recorded"], "the trainer died of a stop that was not yet on record"
        assert any("recorded a deliberate stop" in line for line in detail.output), detail.output
    finally:
        stop_all(target)


def test_a_look_that_reads_a_death_reads_a_stop_recorded_while_it_looked(tmp_path):
    # The look is stopped, for real, between its read of the trainer's liveness and of its exit record: the exit record
    # is a FIFO, which the look opens only once liveness is read. A person's stop recorded then (before the death it
    # causes is on record, as stop.sh records it) must be in the look: read first, it would be a crash to hand over.
    target = shell_target(tmp_path)
    state = Path(target.state_path)
    run = state / "runs" / "r1"
    run.mkdir(parents=True)
    (state / "current").write_text("r1\n")
    gone = subprocess.Popen(["true"])
    gone.wait()
    (run / "pid").write_text(f"{gone.pid} 1\n")  # a trainer that is gone
    fifo = run / "exit_code"
    os.mkfifo(fifo)
    with ThreadPoolExecutor(max_workers=2) as pool:
        looked = pool.submit(look, target)
        opened = pool.submit(os.open, fifo, os.O_WRONLY)  # returns once the look opens its exit record to read it
        wait([looked, opened], timeout=60, return_when=FIRST_COMPLETED)
        if not opened.done():
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # let the opener go: the look never read it
            raise AssertionError(f"the look never read the exit record: {looked.result()}")
        (state / "stopped").write_text(f"{time.time():.6f}\n")
        os.write(opened.result(), b"143\n")
        os.close(opened.result())
        pulse = looked.result(timeout=60)
    assert pulse.exit_code == 143 and not pulse.pid_alive, pulse
    assert pulse.stopped and seen(pulse) is Seen.IDLE, f"a death by a person's stop read as a death to hand over: {pulse}"


def test_a_recovery_the_watch_starts_leaves_a_target_stopped_on_purpose_stopped(tmp_path, prefect_harness):
    # The death the watch saw came before a person's stop (or was the stop's own): handed over, the recovery finds the
    # target stopped on purpose, and leaves it; `relaunch recover` (a person's word) is what starts it again.
    target = shell_target(tmp_path)
    first, _ = launch.fn(target, 1)
    try:
        stop.fn(target, deliberate=True)
        report = watching._recover(target)
        (attempt,) = report.attempts
        assert (attempt.verdict, attempt.action) == (Verdict.STOPPED, Action.NONE), report.timeline()
        assert "stopped on purpose: the watch leaves it" in attempt.why, attempt.why
        assert runs(target) == [first.run_id] and not tmux_alive(target.tmux_session), "nothing launched"
        assert (Path(target.state_path) / "stopped").exists()
    finally:
        stop_all(target)


@pytest.mark.parametrize("load", ["quiet", "loaded"])
def test_a_persons_stop_under_the_running_watch_is_never_undone_however_often_it_is_made(tmp_path, prefect_harness, request, load):
    if load == "loaded":
        request.getfixturevalue("cpu_hogs")
    target = shell_target(tmp_path)
    said = Said()
    watch = Watch([write_target(tmp_path / "target.yaml", target)], said)
    runner = threading.Thread(target=watch.run, args=(1.0,), daemon=True)
    runner.start()
    try:
        launched = stop_again_and_again(target, said, 10 if load == "quiet" else 5)
    finally:
        watch.stopping.set()
        runner.join(300)
        stop_all(target)
    assert not runner.is_alive()
    never_undone(target, said, launched)


def test_a_persons_stop_under_the_watch_flow_is_never_undone_however_often_it_is_made(tmp_path, prefect_harness, monkeypatch):
    # The form `relaunch deploy --watch` runs: the watch-training flow (its recoveries are subflows). The flow's Watch
    # is the test's to stop, and what it logs is the test's to read as well.
    said, made = Said(), []

    class Heard(Watch):
        def __init__(self, sources, say, *args, **kwargs) -> None:
            super().__init__(sources, lambda line: (say(line), said(line)), *args, **kwargs)
            made.append(self)

    monkeypatch.setattr(watching, "Watch", Heard)
    target = shell_target(tmp_path)
    ended: list[str] = []
    runner = threading.Thread(target=lambda: ended.append(watch_training(target, interval_seconds=1.0, duration_seconds=3600)), daemon=True)
    runner.start()
    try:
        said.wait(f"watching {target.name}", timeout=120)
        launched = stop_again_and_again(target, said, 5)
    finally:
        wait_for(lambda: made, 60, "the flow's watch")
        made[0].stopping.set()
        runner.join(300)
        stop_all(target)
    assert not runner.is_alive() and ended and "last seen idle" in ended[0], ended
    never_undone(target, said, launched)


# ---- a Prefect API that is down ---------------------------------------------------------------------------------------


def test_only_an_api_that_does_not_answer_is_read_as_one(tmp_path, prefect_harness):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/api"  # closed once the block ends: refused
    target = shell_target(tmp_path)
    with temporary_settings({PREFECT_API_URL: closed}), pytest.raises(Exception) as refused:
        write_handed(target, "r1")
    assert api_unreachable(refused.value), repr(refused.value)
    try:
        try:
            raise httpx.ConnectError("refused")
        except httpx.ConnectError as inner:
            raise RuntimeError("Failed to reach API at http://127.0.0.1:1/api") from inner
    except RuntimeError as wrapped:
        assert api_unreachable(wrapped), "Prefect's own wrapping of a refused connection"
    assert not api_unreachable(ValueError("a bug")) and not api_unreachable(KeyError("r1")), "a bug is said, not retried"


def test_a_recovery_the_api_failed_is_tried_again_until_it_runs_and_the_death_is_handed_over_once(tmp_path, prefect_harness, monkeypatch):
    # The record of the handover is written; the recovery then meets an API that does not answer (Prefect's own `Failed
    # to reach API`: this one recovery is pointed at a closed port), and is tried again once the backoff is over.
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/api"
    tries: list[str] = []

    def cut_off_once(target: Target):
        tries.append(target.name)
        if len(tries) == 1:
            with temporary_settings({PREFECT_API_URL: closed}):
                return real(target)
        return real(target)

    real = watching._recover
    monkeypatch.setattr(watching, "_recover", cut_off_once)
    target = shell_target(tmp_path)
    first, _ = launch.fn(target, 1)
    said = Said()
    watch = Watch([write_target(tmp_path / "target.yaml", target)], said)
    runner = threading.Thread(target=watch.run, args=(1.0,), daemon=True)
    runner.start()
    try:
        said.wait(f"running (run {first.run_id}", timeout=60)
        os.kill(first.pid, signal.SIGKILL)
        down = said.wait("does not answer", timeout=60)
        assert closed.removesuffix("/api") in down and "Failed to reach API" in down, down
        ended = said.wait("recovery ended", "recovery failed", timeout=120)
        assert "recovered" in ended, said.lines
    finally:
        watch.stopping.set()
        runner.join(300)
        stop_all(target)
    assert tries == [target.name, target.name] and said.count("does not answer") == 1, said.lines
    assert read_handed(target) == first.run_id and sum("died" in line for line in said.lines) == 1, said.lines
    assert len(runs(target)) == 2 and current(target) != first.run_id


class Server:
    """`prefect server start` on a port of its own, in a PREFECT_HOME of its own (its database kept across restarts)."""

    def __init__(self, home: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.home, self.api_url = home, f"http://127.0.0.1:{self.port}/api"
        home.mkdir(parents=True)
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "PREFECT_HOME": str(self.home),
            "PREFECT_API_URL": self.api_url,
            "DO_NOT_TRACK": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_UI_ENABLED": "false",
        }
        with (self.home / "server.log").open("ab") as out:
            self.process = subprocess.Popen(
                [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(self.healthy, 240, f"the Prefect server at {self.api_url} to answer", interval=0.2)

    def healthy(self) -> bool:
        assert self.process is not None and self.process.poll() is None, (self.home / "server.log").read_text()[-3000:]
        try:
            return httpx.get(f"{self.api_url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """SIGTERM to the server's own group (its uvicorn child with it), then SIGKILL after 30 s; gone when this returns."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # a child left in the group (uvicorn) holds the port
        except ProcessLookupError:
            pass


@pytest.fixture
def server(tmp_path) -> Iterator[Server]:
    s = Server(tmp_path / "server")
    s.start()
    try:
        yield s
    finally:
        s.stop()


def test_a_death_while_the_prefect_api_is_down_is_recovered_once_it_answers_again_and_said_once(tmp_path, server):
    target = shell_target(tmp_path / "t")
    source = write_target(tmp_path / "target.yaml", target)
    first, _ = launch.fn(target, 1)
    env = {**os.environ, "PREFECT_API_URL": server.api_url, "PREFECT_HOME": str(tmp_path / "client"), "DO_NOT_TRACK": "1"}
    said = Said()
    watch = subprocess.Popen(
        [str(BIN / "relaunch"), "watch", str(source), "--interval-seconds", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    reader = threading.Thread(target=lambda: [said(line.rstrip("\n")) for line in watch.stdout or []], daemon=True)
    reader.start()
    try:
        said.wait(f"{target.name}: running (run {first.run_id}", timeout=120)
        server.stop()
        os.kill(first.pid, signal.SIGKILL)
        down = said.wait("does not answer", timeout=60)
        assert server.api_url.removesuffix("/api") in down and first.run_id in down and "retried" in down, down
        server.start()
        ended = said.wait("recovery ended", "recovery failed", timeout=240)
        assert "recovery ended" in ended and "recovered" in ended, said.lines
        assert said.count("does not answer") == 1, f"said once, not every retry: {said.lines}"
        assert said.count("answers again") == 1, said.lines
        assert len(runs(target)) == 2 and current(target) != first.run_id, said.lines
    finally:
        if watch.poll() is None:
            watch.send_signal(signal.SIGTERM)
            try:
                watch.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(watch.pid, signal.SIGKILL)  # the group this test started the watch in
                watch.wait()
        reader.join(30)
        stop_all(target)


def test_a_look_at_a_launch_whose_supervisor_has_not_recorded_a_pid_yet_is_no_death_until_a_launch_would_have_failed():
    from relaunch.judging.watching import LAUNCH_SECONDS, Pulse, Seen, hand_over, seen

    launch = Pulse(run_id="r2", pid=None, pid_alive=False, supervisor_alive=False, started_at_epoch=1000.0, host_now_epoch=1000.4)
    assert seen(launch) is Seen.LAUNCHING and not hand_over(launch, "r1")
    late = launch.model_copy(update={"host_now_epoch": 1000.0 + LAUNCH_SECONDS + 1})
    assert seen(late) is Seen.DIED and hand_over(late, "r1"), "a launch that never recorded its trainer is a death to recover"
    exited = launch.model_copy(update={"exit_code": 2})
    assert seen(exited) is Seen.DIED, "a trainer that exited at once has its exit recorded: a death"
