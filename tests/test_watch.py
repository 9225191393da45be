"""`relaunch watch`: a death is handed to recover-training the round it is seen; nothing else ever is, and the watch
itself stops nothing. The reading of a look is generated; the loop runs on real trainers in tmux."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from relaunch.config import Host
from relaunch.flows.watch import Watch, look, watch_training
from relaunch.judging.watching import Pulse, Seen, hand_over, seen
from relaunch.tasks.launch import launch
from relaunch.tasks.memory import read_handed, write_handed
from relaunch.tasks.stop import stop
from relaunch.testing.faults import wait_for
from relaunch.testing.targets import current, runs, shell_target, stop_all, wait_for_exit
from relaunch.vocabulary import Verdict

pulses = st.builds(
    Pulse,
    run_id=st.one_of(st.none(), st.sampled_from(["r1", "r2"])),
    pid=st.one_of(st.none(), st.integers(1, 1 << 22)),
    pid_alive=st.booleans(),
    supervisor_alive=st.booleans(),
    exit_code=st.one_of(st.none(), st.integers(0, 255)),
    stopped=st.booleans(),
    foreign=st.one_of(st.none(), st.just("other llama /repo s")),
)


@given(pulses, st.one_of(st.none(), st.sampled_from(["r1", "r2"])))
def test_a_look_hands_over_only_a_death_of_a_run_not_handed_over_before(pulse, handled):
    handed = hand_over(pulse, handled)
    if pulse.pid_alive or pulse.stopped or pulse.foreign or pulse.run_id is None:
        assert not handed, "a live trainer, a person's stop, another target's folder or nothing on record: never"
    elif pulse.exit_code is None and pulse.supervisor_alive:
        assert seen(pulse) is Seen.DYING and not handed, "its supervisor is still recording the exit: next round"
    else:
        assert handed == (pulse.run_id != handled), "every death once, and only once"


def write_target(path: Path, target) -> Path:
    path.write_text(yaml.safe_dump(target.model_dump(mode="json")))
    return path


@pytest.fixture
def lines() -> list[str]:
    return []


def test_a_sigkilled_trainer_is_recovered_by_the_watch_the_round_its_death_is_seen(tmp_path, prefect_harness, lines):
    target = shell_target(tmp_path)
    source = write_target(tmp_path / "target.yaml", target)
    first, _ = launch.fn(target, 1)
    watch = Watch([source], lines.append)
    try:
        watch.round()
        assert watch.watched[target.name].last is Seen.RUNNING and watch.watched[target.name].recovery is None, lines
        os.kill(first.pid, signal.SIGKILL)
        wait_for(lambda: (watch.round(), watch.watched[target.name].recovery)[1], 60, "the watch to hand the death over", interval=0.2)
        report = watch.watched[target.name].recovery.result(timeout=300)
        watch.finish()
        assert report.ok and report.verdict is Verdict.HEALTHY, report.timeline()
        assert current(target) != first.run_id and len(runs(target)) == 2, lines
        assert any("died" in line and first.run_id in line for line in lines), lines
    finally:
        stop_all(target)


def test_a_run_a_person_stopped_or_one_never_launched_is_never_handed_over(tmp_path, prefect_harness, lines):
    stopped, idle = shell_target(tmp_path / "a", name="stopped"), shell_target(tmp_path / "b", name="idle")
    sources = [write_target(tmp_path / "a.yaml", stopped), write_target(tmp_path / "b.yaml", idle)]
    launch.fn(stopped, 1)
    try:
        stop.fn(stopped, deliberate=True)
        wait_for_exit(stopped)
        watch = Watch(sources, lines.append)
        for _ in range(3):
            watch.round()
        assert all(w.recovery is None for w in watch.watched.values()), lines
        assert {w.last for w in watch.watched.values()} == {Seen.IDLE}
        watch.finish()
        assert len(runs(stopped)) == 1 and not runs(idle), "nothing launched"
    finally:
        stop_all(stopped, idle)


def test_a_target_file_that_stops_validating_is_said_once_and_the_target_watched_as_it_last_was(tmp_path, prefect_harness, lines):
    target = shell_target(tmp_path)
    source = write_target(tmp_path / "target.yaml", target)
    watch = Watch([source], lines.append)
    watch.round()
    source.write_text(source.read_text().replace("launch_command:", "lanch_command:"))
    watch.round()
    watch.round()
    said = [line for line in lines if str(source) in line]
    assert len(said) == 1 and "lanch_command" in said[0] and target.name in said[0], lines
    assert target.name in watch.watched and watch.watched[target.name].last is Seen.IDLE
    write_target(source, target)
    watch.round()
    watch.finish()
    assert any("reads again" in line for line in lines), lines


def test_a_host_that_cannot_be_reached_is_no_death_and_is_said_once_per_streak(tmp_path, prefect_harness, lines):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: every connection is refused
    known = tmp_path / "known_hosts"
    known.write_text("")
    away = shell_target(tmp_path, host=Host(kind="ssh", hostname="127.0.0.1", port=port, user="root", known_hosts_path=str(known)))
    watch = Watch([write_target(tmp_path / "away.yaml", away)], lines.append)
    watch.round()
    watch.round()
    watch.finish()
    assert watch.watched[away.name].recovery is None and watch.watched[away.name].unreachable, lines
    assert sum("cannot be reached" in line for line in lines) == 1, lines
    assert not any("one incident" in line for line in lines), "one host down is no partition"


def test_hosts_that_stop_answering_together_are_one_partition_said_once(tmp_path, prefect_harness, lines):
    known = tmp_path / "known_hosts"
    known.write_text("")
    sources = []
    for i in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # closed once the block ends: refused
        away = shell_target(
            tmp_path / f"h{i}",
            name=f"away{i}",
            host=Host(kind="ssh", hostname="127.0.0.1", port=port, user="root", known_hosts_path=str(known)),
        )
        sources.append(write_target(tmp_path / f"away{i}.yaml", away))
    watch = Watch(sources, lines.append)
    for _ in range(3):
        watch.round()
    watch.finish()
    said = [line for line in lines if line.startswith("one incident: unreachable on 3 hosts")]
    assert len(said) == 1 and "nothing is stopped or launched on them" in said[0], lines
    assert all(w.recovery is None for w in watch.watched.values())


def test_a_host_that_hangs_holds_only_its_own_look_and_a_death_elsewhere_is_handed_over_meanwhile(tmp_path, prefect_harness, lines):
    # A host that takes the connection and never says a word (a wedged sshd, a half-dead NIC): each look hangs
    # until its connect timeout.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    known = tmp_path / "known_hosts"
    known.write_text("")
    host = Host(
        kind="ssh", hostname="127.0.0.1", port=silent.getsockname()[1], user="root", known_hosts_path=str(known), connect_timeout_seconds=20
    )
    hung = shell_target(tmp_path / "hung", name="hung", host=host)
    local = shell_target(tmp_path / "local", name="local")
    first, _ = launch.fn(local, 1)
    watch = Watch([write_target(tmp_path / "hung.yaml", hung), write_target(tmp_path / "local.yaml", local)], lines.append)
    try:
        watch.round(wait_seconds=1)
        assert watch.watched["local"].last is Seen.RUNNING, lines
        assert watch.watched["hung"].looking is not None and sum("has not answered" in line for line in lines) == 1, lines
        os.kill(first.pid, signal.SIGKILL)
        wait_for(lambda: (watch.round(wait_seconds=1), watch.watched["local"].recovery)[1], 15, "the death to be handed over", interval=0.2)
        assert not watch.watched["hung"].looking.done(), "the hung host's first look is still out: it held nothing"
        assert sum("has not answered" in line for line in lines) == 1, "said once per look"
        report = watch.watched["local"].recovery.result(timeout=300)
        assert report.ok, report.timeline()
    finally:
        watch.finish()
        silent.close()
        stop_all(local)


def test_the_watch_flow_hands_a_death_over_once_across_its_own_runs(tmp_path, prefect_harness):
    # Each run of the watch deployment is a fresh process: which death was handed over lives in a Prefect Variable.
    target = shell_target(tmp_path)
    first, _ = launch.fn(target, 1)
    try:
        os.kill(first.pid, signal.SIGKILL)
        wait_for_exit(target)
        write_handed(target, first.run_id)  # as an earlier run of the watch left it
        said = watch_training(target, interval_seconds=0.5, duration_seconds=0.5)
        assert runs(target) == [first.run_id], "a death an earlier watch run handed over is not handed over again"
        assert "last seen died" in said, said
        write_handed(target, "an-older-run")
        watch_training(target, interval_seconds=0.5, duration_seconds=0.5)
        assert len(runs(target)) == 2 and current(target) != first.run_id, "a death not handed over before is recovered"
        assert read_handed(target) == first.run_id, "and remembered"
    finally:
        stop_all(target)


def test_deploy_with_watch_adds_a_watch_run_every_ten_minutes_one_at_a_time_that_undeploy_removes(tmp_path, prefect_harness, lines):
    from prefect.client.orchestration import get_client

    from relaunch.cli.deploy import WATCH_RUN_SECONDS, deploy, undeploy

    target = shell_target(tmp_path, name=f"watched-{uuid.uuid4().hex[:6]}")
    source = write_target(tmp_path / "target.yaml", target)
    pool = f"relaunch-{target.name}"  # no worker polls it: nothing scheduled here runs
    done = deploy(target, source, "0 3 * * *", "UTC", pool, lines.append, watch_interval_seconds=5)
    again = deploy(target, source, "0 3 * * *", "UTC", pool, lines.append, watch_interval_seconds=5)
    assert done.watch_deployment == again.watch_deployment == f"watch-training/watch-{target.name}", done
    with get_client(sync_client=True) as client:
        watch = client.read_deployment_by_name(done.watch_deployment)
        same = [d for d in client.read_deployments() if d.name == f"watch-{target.name}"]
    (schedule,) = watch.schedules
    assert (schedule.slug, schedule.schedule.interval.total_seconds()) == ("watch", WATCH_RUN_SECONDS), schedule
    assert watch.entrypoint == "relaunch.flows.watch.watch_training" and not watch.pull_steps and len(same) == 1
    assert watch.parameters == {"target": target.model_dump(mode="json"), "interval_seconds": 5, "duration_seconds": WATCH_RUN_SECONDS}
    assert watch.global_concurrency_limit is not None and watch.global_concurrency_limit.limit == 1, "one watch of a target at a time"
    removed = undeploy(target.name, lines.append)
    assert done.watch_deployment in removed and len(removed) == 3, lines


def test_a_look_reads_the_recorded_trainer_alive_then_dead_with_its_exit_record(tmp_path):
    target = shell_target(tmp_path)
    assert look(target).run_id is None
    detail, _ = launch.fn(target, 1)
    try:
        alive = look(target)
        assert (alive.run_id, alive.pid, alive.pid_alive) == (detail.run_id, detail.pid, True)
        os.kill(detail.pid, signal.SIGKILL)
        wait_for_exit(target)
        dead = wait_for(lambda: (p := look(target)).exit_code is not None and p, 30, "the exit record")
        assert not dead.pid_alive and dead.exit_code == 137 and seen(dead) is Seen.DIED
    finally:
        stop_all(target)


def test_a_held_look_lasts_its_hold_while_the_trainer_lives_and_ends_at_its_death_with_the_exit_code(tmp_path):
    target = shell_target(tmp_path)
    detail, _ = launch.fn(target, 1)
    try:
        started = time.monotonic()
        alive = look(target, hold_seconds=1.0)
        assert alive.pid_alive and time.monotonic() - started >= 1.0, "held while the trainer lives"
        with ThreadPoolExecutor(max_workers=1) as pool:
            held = pool.submit(look, target, 120.0)
            os.kill(detail.pid, signal.SIGKILL)
            dead = held.result(timeout=30)  # long before its hold is over
        assert not dead.pid_alive and dead.exit_code == 137 and seen(dead) is Seen.DIED, dead
    finally:
        stop_all(target)


def test_the_running_watch_hands_a_death_over_long_before_its_interval_is_over(tmp_path, prefect_harness, lines):
    target = shell_target(tmp_path)
    first, _ = launch.fn(target, 1)
    watch = Watch([write_target(tmp_path / "target.yaml", target)], lines.append)
    runner = threading.Thread(target=watch.run, args=(300.0,), daemon=True)
    runner.start()
    try:
        wait_for(lambda: watch.watched.get(target.name) and watch.watched[target.name].looking is not None, 30, "the first look")
        os.kill(first.pid, signal.SIGKILL)
        wait_for(lambda: any("died" in line for line in lines), 30, "the death handed over, its look held for 300 s")
    finally:
        watch.stopping.set()
        runner.join(300)
        stop_all(target)
    assert not runner.is_alive() and len(runs(target)) == 2, lines


def test_relaunch_watch_as_typed_watches_for_its_rounds_and_refuses_a_file_that_is_not_there(tmp_path):
    import subprocess
    import sys

    exe = str(Path(sys.executable).parent / "relaunch")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), DO_NOT_TRACK="1")
    source = write_target(tmp_path / "target.yaml", shell_target(tmp_path / "t"))
    ok = subprocess.run(
        [exe, "watch", str(source), "--rounds", "2", "--interval-seconds", "0.5"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert ok.returncode == 0 and "watching t on local" in ok.stdout and "t: idle" in ok.stdout, ok.stdout + ok.stderr
    missing = subprocess.run(
        [exe, "watch", str(tmp_path / "nope.yaml"), "--rounds", "1"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr, missing.stdout + missing.stderr
