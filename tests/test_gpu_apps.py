"""The GPU's processes, as evidence of whose work it is: the run's own tree, or another job's (a real H200 capture)."""

from __future__ import annotations

from pathlib import Path

from relaunch.config import Thresholds
from relaunch.judging.diagnosis import diagnose
from relaunch.judging.snapshot import GpuSample, HealthSnapshot
from relaunch.plans.health import parse_gpu_apps

CAPTURE = Path(__file__).parent / "fixtures" / "gpu_host" / "apps_running.csv"


def snapshot(tree: list[int]) -> HealthSnapshot:
    return HealthSnapshot(
        launched=True,
        pid=tree[0],
        pid_alive=True,
        tree_pids=tree,
        seconds_since_launch=120,
        seconds_since_log_write=1,
        log_tail=[f"step={n} loss=3.6 | (20.0Ktok/s)" for n in range(1, 6)],
        gpus=[GpuSample(index=0, memory_used_mib=8976, utilization_percent=97)],
        gpu_apps=parse_gpu_apps(CAPTURE.read_text().splitlines()),
    )


def test_the_gpus_processes_are_read_from_nvidia_smis_compute_apps_as_captured_on_an_h200():
    assert [(a.pid, a.used_memory_mib) for a in parse_gpu_apps(CAPTURE.read_text().splitlines())] == [(607, 8976)]
    assert [(a.pid, a.used_memory_mib) for a in parse_gpu_apps(["607, 8976", "", "N/A, N/A"])] == [(607, 8976)]


def test_gpu_memory_held_by_the_runs_own_process_is_named_as_its_work():
    d = diagnose(snapshot([600, 607]), Thresholds(healthy_steps=3))
    assert "GPU memory held by its processes: PID 607 (8976 MiB)" in d.evidence, d.evidence


def test_gpu_memory_held_by_another_jobs_process_is_said_to_be_not_the_runs():
    d = diagnose(snapshot([700, 701]), Thresholds(healthy_steps=3))
    assert any(line.startswith("none of the 1 process(es) holding GPU memory is of its tree") for line in d.evidence), d.evidence
