"""relaunch's launch, poll and stop, recorded on a real H200 host, read back by the same parser and decision."""

from __future__ import annotations

from pathlib import Path

from relaunch.config import Thresholds
from relaunch.judging.diagnosis import advance, diagnose
from relaunch.judging.findings import Progress
from relaunch.plans.health import parse_gpu_csv, parse_snapshot
from relaunch.vocabulary import Cause, Verdict

HOST = Path(__file__).parent / "fixtures" / "gpu_host"
T = Thresholds(expected_gpus=1)
NONCE = "gpuhostcheck"  # bench/gpu_host_check/make_run.py


def polls():
    return [parse_snapshot((HOST / f"poll_{i}.txt").read_text(), "h200", NONCE) for i in range(1, 13)]


def test_a_gpu_trainer_goes_from_starting_to_healthy_as_its_step_lines_arrive():
    progress, verdicts = Progress(), []
    for snap in polls():
        progress = advance(progress, snap, T)
        verdicts.append(diagnose(snap, T, progress).verdict)
    assert verdicts[0] is Verdict.STARTING and verdicts[-1] is Verdict.HEALTHY
    assert Verdict.CRASHED not in verdicts and Verdict.STALLED not in verdicts
    assert verdicts.index(Verdict.HEALTHY) == verdicts.count(Verdict.STARTING)


def test_gpu_samples_come_back_from_the_poll_with_memory_and_utilisation():
    # Captured on a two-GPU host: the trainer holds GPU 0 (8 GiB ballast plus its context), GPU 1 idles.
    last = polls()[-1]
    assert [(g.index, g.memory_used_mib) for g in last.gpus] == [(0, 8985), (1, 4)]
    assert last.gpus[0].utilization_percent > 50 and last.gpus[1].utilization_percent == 0
    d = diagnose(last, T)
    assert d.metrics.gpu_memory_used_mib == [8985, 4]
    # expected_gpus=1: the idle second GPU is not the trainer's and raises no alarm.
    assert d.verdict is Verdict.HEALTHY


def test_stop_ended_every_process_and_released_the_gpu():
    assert "stopped (" in (HOST / "stop.txt").read_text()
    assert parse_gpu_csv((HOST / "gpu_after_stop.csv").read_text())[0].memory_used_mib == 0
    after = parse_snapshot((HOST / "poll_after_stop.txt").read_text(), "h200", NONCE)
    d = diagnose(after, T)
    assert (after.exit_code, d.verdict, d.cause) == (143, Verdict.CRASHED, Cause.KILLED)
