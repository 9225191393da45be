"""Goodput arithmetic on constructed timelines (timelines are data: each second's category is known by construction)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from relaunch.records.goodput import Observation, StepSpan, Timeline, compute, report, table, text_table, trend_markdown
from relaunch.vocabulary import Category, Step, Verdict

DAY = datetime(2026, 1, 1, tzinfo=UTC)


def at(hours: float) -> datetime:
    return DAY + timedelta(hours=hours)


def minutes(m: float) -> float:
    return m * 60.0


def crashed_and_recovered() -> Timeline:
    """Run a stepping at 1 step/s, dead at 01:30 (step 4600), found at 03:00; recovered 03:01-03:21; run b resumed
    from the checkpoint of step 4000 and took its first step at 03:23."""
    return Timeline(
        target="t",
        observations=[
            Observation(
                at=at(0.5),
                verdict=Verdict.HEALTHY,
                run_id="a",
                seconds_since_launch=3600,
                last_step_seconds=3599,
                last_step=1000,
                seconds_per_step=1.0,
            ),
            Observation(at=at(3), verdict=Verdict.CRASHED, run_id="a", seconds_since_launch=12600, last_step_seconds=7200, last_step=4600),
            Observation(
                at=at(3) + timedelta(minutes=25),
                verdict=Verdict.HEALTHY,
                run_id="b",
                seconds_since_launch=270,
                first_step_seconds=150,
                first_step=4001,
                last_step_seconds=265,
                last_step=4115,
                seconds_per_step=1.0,
                resumed_from_step=4000,
            ),
        ],
        steps=[
            StepSpan(step=Step.STOP, started_at=at(3) + timedelta(minutes=1), ended_at=at(3) + timedelta(minutes=2)),
            StepSpan(step=Step.REBUILD_VENV, started_at=at(3) + timedelta(minutes=2), ended_at=at(3) + timedelta(minutes=10)),
            StepSpan(step=Step.WARM_CACHE, started_at=at(3) + timedelta(minutes=10), ended_at=at(3) + timedelta(minutes=20)),
            StepSpan(step=Step.LAUNCH, started_at=at(3) + timedelta(minutes=20), ended_at=at(3) + timedelta(minutes=21)),
        ],
    )


def test_a_crash_found_hours_later_splits_the_night_into_every_category_and_the_categories_add_up_to_the_window():
    g = compute(crashed_and_recovered(), at(0), at(6))
    s = g.total.seconds
    assert s[Category.WASTED] == minutes(10), "600 steps past the checkpoint of step 4000, at 1 s each"
    assert s[Category.PRODUCTIVE] == minutes(80) + minutes(157), "00:00-01:20 of run a, 03:23-06:00 of run b"
    assert s[Category.DETECTION] == minutes(90), "the last step line at 01:30, the verdict at 03:00"
    assert (s[Category.STOP], s[Category.REBUILD], s[Category.WARM_UP], s[Category.LAUNCH]) == (60, minutes(8), minutes(10), 60)
    assert s[Category.RECOVERY_OTHER] == 60, "the verdict at 03:00 to the stop at 03:01"
    assert s[Category.START_UP] == minutes(2), "the launch step ends 03:21, the first step line at 03:23"
    assert s[Category.NOT_RUNNING] == 0 and s[Category.ESCALATED] == 0
    assert g.total.window_seconds == 6 * 3600
    assert round(g.total.goodput_percent, 2) == round(100 * 237 / 360, 2)


def test_an_escalated_crash_counts_waiting_for_a_person_until_the_window_ends_and_each_utc_night_gets_its_own_row():
    timeline = Timeline(
        target="t",
        observations=[
            Observation(
                at=at(22.5),
                verdict=Verdict.HEALTHY,
                run_id="a",
                seconds_since_launch=1800,
                first_step_seconds=60,
                first_step=1,
                last_step_seconds=1790,
                last_step=100,
                seconds_per_step=17.0,
            ),
            Observation(
                at=at(25), verdict=Verdict.CRASHED, run_id="a", seconds_since_launch=3 * 3600, last_step_seconds=3600, last_step=200
            ),
        ],
        escalations=[at(25) + timedelta(seconds=30)],
    )
    g = compute(timeline, at(22), at(28))
    first, second = g.nights
    assert first.night == "2026-01-01" and second.night == "2026-01-02"
    assert first.seconds[Category.START_UP] == 60 and first.seconds[Category.PRODUCTIVE] == minutes(59)
    assert first.seconds[Category.DETECTION] == minutes(60) == second.seconds[Category.DETECTION], "23:00 to 01:00, cut at midnight"
    assert second.seconds[Category.NOT_RUNNING] == 30, "the verdict to the escalation"
    assert second.seconds[Category.ESCALATED] == 3 * 3600 - 30, "01:00:30 to 04:00"
    assert g.total.seconds[Category.WASTED] == 0, "no run resumed, so no steps were redone"
    assert [r["night"] for r in table(g)] == ["2026-01-01", "2026-01-02", "total"]
    lines = text_table(g).splitlines()
    assert lines[1].split() == ["night", "goodput", "productive", "detection", "start_up", "escalated", "not_running"], lines
    assert lines[-1].split()[:3] == ["total", "16.4%", "59.0"], lines  # 59 productive minutes of 6 h


def test_a_run_started_by_hand_from_no_known_checkpoint_and_first_seen_stepping_redid_nothing_relaunch_can_tell():
    timeline = crashed_and_recovered()
    # Run b as a person started it: no checkpoint on record, already stepping when a check first saw it.
    timeline.observations[-1] = timeline.observations[-1].model_copy(update={"resumed_from_step": None, "first_step_seconds": None})
    s = compute(timeline, at(0), at(6)).total.seconds
    assert s[Category.WASTED] == 0 and s[Category.PRODUCTIVE] == minutes(90) + minutes(160) - 30, s


def test_an_escalation_ends_at_the_next_launch_a_person_asked_for():
    timeline = crashed_and_recovered()
    timeline.escalations = [at(3) + timedelta(seconds=30)]
    # The recovery of 03:01 as a person's, after the escalation: waiting ends when its launch starts.
    s = compute(timeline, at(0), at(6)).total.seconds
    assert s[Category.ESCALATED] == 30, "03:00:30 to 03:01, the stop then takes over by priority"


def test_a_venv_built_beside_a_run_that_still_steps_is_productive_time_and_its_stop_ends_the_stepping():
    timeline = Timeline(
        target="t",
        observations=[
            Observation(at=at(0.5), verdict=Verdict.HEALTHY, run_id="a", seconds_since_launch=3600, last_step_seconds=3599, last_step=3599)
        ],
        steps=[
            StepSpan(step=Step.BUILD_VENV, started_at=at(0.6), ended_at=at(0.8)),
            StepSpan(step=Step.STOP, started_at=at(0.8), ended_at=at(0.8) + timedelta(seconds=30)),
        ],
    )
    s = compute(timeline, at(0), at(1)).total.seconds
    assert s[Category.PRODUCTIVE] == minutes(48) and s[Category.REBUILD] == 0
    assert s[Category.STOP] == 30 and s[Category.NOT_RUNNING] == minutes(12) - 30


def test_a_target_with_nothing_recorded_is_not_running_all_window_and_the_trend_says_zero():
    g = compute(Timeline(target="t"), at(0), at(24))
    assert g.total.seconds[Category.NOT_RUNNING] == 24 * 3600 and g.total.goodput_percent == 0
    assert "**0.0%** productive" in trend_markdown(g)
    assert text_table(report(Timeline(target="t"), 7, at(0))).startswith("nothing recorded about t up to 2026-01-01 00:00 UTC")


# ---- a real crash and recovery, against the test's own clock ---------------------------------------------------


def now() -> datetime:
    return datetime.now(UTC)


def log_reaches(target, step: int) -> bool:
    from relaunch.testing.targets import current_log

    return f"step={step} " in current_log(target).read_text()


def last_step_in_log(target) -> int:
    from relaunch.testing.targets import current_log

    return max(int(m) for m in re.findall(r"^step=(\d+) ", current_log(target).read_text(), re.M))


def stored(target, start: datetime, end: datetime) -> Timeline | None:
    """The timeline once the server holds every verdict event of the test (4) and the launch's task run."""
    from relaunch.tasks.goodput import collect_timeline

    timeline = collect_timeline.fn(target.name, start, end)
    complete = len(timeline.observations) >= 4 and any(s.step is Step.LAUNCH for s in timeline.steps)
    return timeline if complete else None


def test_a_real_crash_and_recovery_is_counted_category_by_category_as_the_tests_own_clock_saw_it(prefect_harness, tmp_path):
    import os
    import signal
    import time
    from pathlib import Path

    from prefect import tags

    from relaunch import runlayout
    from relaunch.flows.check import check_training
    from relaunch.tasks.launch import launch
    from relaunch.testing.faults import wait_for
    from relaunch.testing.targets import current, finished, stop_all, wait_for_exit

    target = shell_target_for_goodput(tmp_path)
    try:
        launch.fn(target, 1)
        assert finished(check_training, target=target).verdict is Verdict.HEALTHY
        start = now()
        # The trainer's save of step n, as it prints the step; the steps after it are the ones a resume redoes.
        n = last_step_in_log(target) + 2
        wait_for(lambda: log_reaches(target, n), 30, f"step {n}")
        saved = now()
        Path(target.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        (Path(target.checkpoint_dir) / f"step_{n}.pt").write_bytes(b"weights")
        wait_for(lambda: log_reaches(target, n + 30), 30, f"step {n + 30}")
        pid = int(Path(runlayout.record(target.state_path, current(target), runlayout.PID)).read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        killed = now()
        wait_for_exit(target)
        time.sleep(1.5)  # a phase of its own: dead and not yet found, which goodput counts as detection
        checked = now()
        with tags("nightly"):  # as the nightly deployments' runs are: they publish the goodput artifacts
            report = finished(check_training, target=target, recover=True)
        end = now()
    finally:
        stop_all(target)
    assert report.ok, report.timeline()
    timeline = wait_for(lambda: stored(target, start, end), 30, "the verdict events and task runs to be stored", interval=0.5)
    g = compute(timeline, start, end)
    s = g.total.seconds
    # A dead run's last step line is dated by its log's last write: the supervisor's exit note, ~0.5 s after the death
    # (relaunch/host/supervisor.sh waits for the run's last processes first), later on a loaded machine.
    assert abs(s[Category.WASTED] - (killed - saved).total_seconds()) < 1.0, s
    assert (checked - killed).total_seconds() - 1.5 < s[Category.DETECTION] < (checked - killed).total_seconds() + 4, s
    steps = {r.step: r.seconds for a in report.attempts for r in a.steps}
    assert abs(s[Category.STOP] - steps[Step.STOP]) < 0.5 and abs(s[Category.LAUNCH] - steps[Step.LAUNCH]) < 0.5, (s, steps)
    rebuilding = [step for step in (Step.BUILD_VENV, Step.REBUILD_VENV, Step.RESTORE_CODE) if step in steps]
    rebuild = sum(steps[step] for step in rebuilding)
    # The category is dated by the task runs, which also hold Prefect's hand-over into each step (its Pending and
    # Running states: tenths of a second each, more with every core busy: 0.5 s over three steps, and 1.1 s over two in
    # a loaded make test of 2026-12-05); the steps' own clocks do not. Never less than the steps' time, and at most a
    # hand-over of 1.5 s a step more: an accounting bound on Prefect's hand-over, no verdict rests on it.
    assert -0.2 < s[Category.REBUILD] - rebuild < 1.5 * len(rebuilding), (s, steps)
    # The new trainer sleeps START_SECONDS before its first step line; a poll dates that line by the log's last write
    # when it first sees it, up to one poll round trip late (seconds, on a loaded 2-core machine).
    assert START_SECONDS - 0.2 < s[Category.START_UP] < START_SECONDS + 4, s
    assert s[Category.PRODUCTIVE] > (saved - start).total_seconds() - 0.5 and s[Category.NOT_RUNNING] < 1.0, s
    assert abs(g.total.window_seconds - (end - start).total_seconds()) < 1e-6

    # The nightly run's table artifact: the same detection (its verdicts come from the run's own report, so they are all
    # there even before the server stores their events).
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["goodput-goodput"])), limit=1)
    rows = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    assert rows[-1]["night"] == "total" and rows[-1]["detection_minutes"] == pytest.approx(s[Category.DETECTION] / 60, abs=0.01), rows

    # The command as typed, against the same server: the same lost time (its window runs on to now).
    import subprocess

    from prefect.settings import PREFECT_API_URL

    from relaunch.tasks.goodput import collect_timeline
    from relaunch.testing.faults import RELAUNCH, ROOT, cli_env, write_target

    # On a loaded host more of the check's polls are stored after the first complete timeline was read (seen in CI=true
    # make test: 1.05 s more wasted; in a fresh clone's make test: 0.01 s, stored between the command's read and the
    # test's), and each dates the dead run's last step line anew: the command reads once two reads 1 s apart agree.
    def read() -> dict:
        return compute(collect_timeline.fn(target.name, start, end), start, end).total.seconds

    def settled() -> dict | None:
        first = read()
        time.sleep(1.0)  # the interval between two reads of the server, not a wait for an event
        return first if read() == first else None

    wait_for(settled, 60, "the server's timeline to stop changing", interval=0.5)
    spec = write_target(target, tmp_path / "target.yaml")
    env = cli_env(tmp_path / "cli-home", PREFECT_API_URL.value())
    out = subprocess.run(
        [RELAUNCH, "goodput", str(spec), "--days", "1", "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    told = json.loads(out.stdout)["total"]["seconds"]
    again = read()  # the server as the command read it
    for category in (Category.WASTED, Category.DETECTION, Category.STOP, Category.LAUNCH):
        assert abs(told[category.value] - again[category]) < 1e-3, (category, told, again)


START_SECONDS = 1.0


def shell_target_for_goodput(tmp_path):
    from relaunch.testing.targets import shell_target

    return shell_target(tmp_path, name="goodput", env={"STEP_SECONDS": "0.1", "START_SECONDS": str(START_SECONDS)})
