"""Recoveries of one host through the scale-out control plane (scripts/scale_demo.py's engine: PostgreSQL, Redis lease
storage, a Prefect server, two process workers, SSH hosts in network namespaces) never overlap and never start a second
trainer: not when two deployment runs race on two workers, and not when the worker holding the host dies mid-recovery.
And what the runs remember across nights (docs/nights.md: Prefect Variables) is one history and one GPU ledger, whichever
worker ran them.

The evidence is the server's history (each recover-training run's task runs: from its first step after the host's slot
and lock to its last) and the host's own records (launch records, and the trainers still running by recorded PID).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from relaunch.testing.faults import ROOT
from relaunch.testing.targets import shell_target
from tests.test_scale_demo import load_scale_demo, require_scale_parts, scale_workdir

LEASE_SECONDS = 60  # flows/recover.py: concurrency(..., lease_duration=60); the server's minimum lease is 60 s
DEPLOYMENT = "recover-training/scale-demo"


# How long the test's copy of the unresponsive-run automation waits after a heartbeat (automations.yaml: 600 s):
# three of the workers' 30 s beats.
UNRESPONSIVE_AFTER_SECONDS = 90


# Host 2 of the engine is a GPU host: nvidia-smi lists GPU 0 at PCI 00:06 (an H200's captured rows), and its kernel
# log holds that GPU's Xid 79 while the file `xid-on` beside the stand-ins is there (tests/test_fleet_failures.py).
GPU_HOST = 2


@pytest.fixture(scope="module")
def engine() -> Iterator:
    require_scale_parts()
    sd = load_scale_demo()
    for workdir in scale_workdir():
        gpu_bin = workdir.parent / "gpu-host-bin"
        gpu_host_commands(gpu_bin)
        with sd.scale_engine(workdir, hosts=3, broken=0, launch=False, host_bins={GPU_HOST: gpu_bin}) as engine:
            sync_automations(engine, workdir)
            yield engine


def gpu_host_commands(folder: Path) -> None:
    from tests.test_fleet_failures import NVIDIA_SMI, XID, dmesg_printing

    folder.mkdir(parents=True)
    folder.chmod(0o755)
    dmesg = dmesg_printing(XID / "xid79_journal.txt").replace("\n", f'\n[ -e "{folder}/xid-on" ] || exit 0\n', 1)
    for name, text in {"dmesg": dmesg, "nvidia-smi": NVIDIA_SMI.replace("{xid}", shlex.quote(str(XID)))}.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)


def sync_automations(engine, workdir: Path) -> None:
    """automations.yaml on the engine's server, with a shorter wait for heartbeats than the shipped 600 s."""
    spec = yaml.safe_load((ROOT / "automations.yaml").read_text())
    for automation in spec["automations"]:
        if automation["name"] == "relaunch-crash-unresponsive-runs":
            automation["trigger"]["within"] = UNRESPONSIVE_AFTER_SECONDS
    path = workdir / "automations.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "automations.py"), "--file", str(path)],
        env=engine.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "relaunch-crash-unresponsive-runs" in out.stdout + out.stderr, out.stdout + out.stderr


def gated_target(engine, index: int, name: str, gate: Path):
    """A never-launched target on host `index` (full recovery: venv, code, warm-up, launch) whose warm-up waits at a gate."""
    gate.mkdir(parents=True)
    warmup = f'touch "{gate}/entered.$$"; until [ -e "{gate}/open" ]; do sleep 0.05; done'
    host = engine.fleet.servers[index].ssh_host(connect_timeout_seconds=5.0, command_timeout_seconds=60.0)
    return shell_target(engine.workdir / "tests" / name, name=name, host=host, warmup_command=warmup)


def wait_for(check, timeout: float, what: str, engine=None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            logs = "".join(f"\n--- {p.log}:\n{p.log.read_text(errors='replace')[-2500:]}" for p in engine.workers if p) if engine else ""
            raise AssertionError(f"{what}: not within {timeout} s{logs}")
        time.sleep(0.2)


def state(engine, run_id) -> str:
    run = engine.call(lambda c: c.read_flow_run(run_id))
    return run.state.name if run.state else "-"


def task_names(engine, run_id) -> list[tuple[str, str]]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    tasks = engine.call(lambda c: c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))))
    return [(t.name.split("@")[0], t.state.name if t.state else "-") for t in tasks]


def slots_in_use(engine, target) -> int:
    from relaunch.flows.recover import host_limit_name

    return engine.call(lambda c: c.read_global_concurrency_limit_by_name(host_limit_name(target))).active_slots


def run_recovery(engine, target, label: str):
    return engine.run(DEPLOYMENT, {"target": target.model_dump(mode="json"), "force": False}, name=f"{label}-{target.name}")


def test_two_deployment_runs_racing_for_one_host_on_two_workers_recover_it_one_after_the_other_with_one_trainer(engine):
    sd = load_scale_demo()
    gate = engine.workdir / "tests" / "race-gate"
    target = gated_target(engine, 0, "race", gate)
    since = datetime.now(UTC)
    first, second = run_recovery(engine, target, "a"), run_recovery(engine, target, "b")
    try:
        # One of them holds the host (slot and lock) in its warm-up; the other is past its preflight and waits for the slot.
        wait_for(lambda: len(list(gate.glob("entered.*"))) == 1, 150, "one recovery to reach its warm-up", engine)
        preflight_done = lambda run: ("preflight", "Completed") in task_names(engine, run)  # noqa: E731
        wait_for(lambda: preflight_done(first) and preflight_done(second), 60, "both runs past their preflight", engine)
        assert [state(engine, r) for r in (first, second)] == ["Running", "Running"]
        assert slots_in_use(engine, target) == 1
        assert len(list(gate.glob("entered.*"))) == 1, "the second waits for the host: it has not warmed up beside the first"
    finally:
        (gate / "open").touch()
    runs = engine.wait_runs([first, second], 240)
    workers = {engine.worker_of(r.id) for r in runs}
    windows = engine.recovery_windows(since)[target.host.hostname]
    trainers = sd.live_trainers(target)
    try:
        assert sorted(r.state.name for r in runs) == ["Completed", "Recovered"], [(r.name, r.state.message) for r in runs]
        assert workers == {0, 1}, f"each worker ran one of the two: {workers}\n{engine.submissions()}"
        assert len(windows) == 2 and sd.overlapping(windows) == [], f"the recoveries one after the other: {windows}"
        assert len(sd.launch_records(target)) == 1 and len(trainers) == 1, f"exactly one trainer: {sd.launch_records(target)} {trainers}"
        later = max(windows, key=lambda w: w[1])[0]
        steps = {name for name, _ in task_names(engine, later)}
        assert steps <= {"preflight", "stop_leftovers", "check_health"}, f"the later run found it recovered and did nothing: {steps}"
        assert slots_in_use(engine, target) == 0
    finally:
        sd._stop_trainers([target])


def test_a_worker_killed_mid_recovery_frees_the_host_within_a_lease_and_a_later_run_recovers_it_with_one_trainer(engine):
    sd = load_scale_demo()
    gate = engine.workdir / "tests" / "kill-gate"
    target = gated_target(engine, 1, "killed", gate)
    since = datetime.now(UTC)
    doomed = run_recovery(engine, target, "doomed")
    try:
        wait_for(lambda: any(gate.glob("entered.*")), 150, "the recovery to reach its warm-up", engine)
        holder = engine.worker_of(doomed)
        assert holder is not None and slots_in_use(engine, target) == 1
        engine.kill_worker(holder)  # SIGKILL: the worker, its process group, the flow-run process under it
        killed_at = datetime.now(UTC)
    finally:
        (gate / "open").touch()  # the orphaned warm-up on the host ends
    # The other worker (idle: one run at a time each) takes the later run at once, well before the lease can run out
    # (renewed every 45 s, so it ends 15 to 60 s after the kill): past its preflight, it waits for the dead run's slot.
    later = run_recovery(engine, target, "later")
    try:
        wait_for(lambda: ("preflight", "Completed") in task_names(engine, later), 60, "the later run past its preflight", engine)
        waiting = {name for name, _ in task_names(engine, later)} == {"preflight"} and slots_in_use(engine, target) == 1
        assert waiting, f"the later run waits while the dead run's lease holds the host: {task_names(engine, later)}"
        [run] = engine.wait_runs([later], LEASE_SECONDS + 150)
        windows = dict((w[0], w) for w in engine.recovery_windows(since)[target.host.hostname])
        trainers = sd.live_trainers(target)
        assert run.state.name == "Recovered", run.state.message
        _, took_host, _ = windows[run.id]
        waited = (took_host - killed_at).total_seconds()
        # At least what was left of the last renewal (15 s), at most a lease plus the repossessor's 2 s loop and retries.
        assert LEASE_SECONDS * 0.25 - 2 <= waited <= LEASE_SECONDS + 20, (
            f"the host was free within a lease of the kill (waited {waited:.0f} s)"
        )
        assert sd.overlapping(list(windows.values())) == [], windows
        assert len(sd.launch_records(target)) == 1 and len(trainers) == 1, f"one trainer: {sd.launch_records(target)} {trainers}"
        assert ("launch", "Completed") in task_names(engine, run.id), "the later run did the whole recovery"
        assert slots_in_use(engine, target) == 0, "the dead run's slot was taken back, the later run's released"
        # Nothing is left to report the killed run's end: the automation marks it Crashed once its heartbeats stop.
        wait_for(lambda: state(engine, doomed) == "Crashed", UNRESPONSIVE_AFTER_SECONDS + 60, "the killed run to be marked Crashed", engine)
        assert "no heartbeat" in engine.call(lambda c: c.read_flow_run(doomed)).state.message
    finally:
        sd._stop_trainers([target])
        engine.start_worker(holder)  # two workers again for whatever runs next on this engine


def test_the_nights_of_one_target_recovered_on_two_workers_share_one_history_and_gpu_ledger_and_a_third_return_is_a_restart_storm(engine):
    from relaunch import runlayout
    from relaunch.tasks.launch import launch
    from relaunch.tasks.memory import history_variable, read_ledger
    from relaunch.testing.targets import current, runs, stop_all, wait_for_exit

    host = engine.fleet.servers[GPU_HOST].ssh_host(connect_timeout_seconds=5.0, command_timeout_seconds=60.0)
    target = shell_target(engine.workdir / "tests" / "nights", name="nights", host=host, env={"CUDA_VISIBLE_DEVICES": "0"}, spare_gpus=[1])
    # Each night the run crashes for real (exit 3 at step 2) on GPU 0; each recovery relaunches it without the fault.
    crashing = target.model_copy(update={"env": {**target.env, "EXIT_AT": "2", "EXIT_CODE": "3"}})
    xid_on = engine.workdir.parent / "gpu-host-bin" / "xid-on"
    nights, workers, placed, stopped = [], [], [], None
    try:
        for night in range(4):
            stop_all(target)
            if night == 0:
                xid_on.touch()  # the first night GPU 0 falls off the bus under it: ledgered, the run moves to the spare
            launch.fn(crashing, 1)
            wait_for_exit(target)
            if night == 1:
                # The second night must land on the other worker: the one that ran the first is away for it.
                stopped = workers[0]
                engine.stop_worker(stopped)
            nights.append(run_recovery(engine, target, f"night{night}"))
            engine.wait_runs(nights[-1:], 240)
            workers.append(engine.worker_of(nights[-1]))  # read now: a restarted worker starts a new log
            xid_on.unlink(missing_ok=True)  # the later nights it crashes of its own error, on GPU 0 again
            spec = Path(runlayout.record(target.state_path, current(target), runlayout.SPEC)).read_text()
            placed.append(next((kv for kv in spec.split("\0") if kv.startswith("CUDA_VISIBLE_DEVICES=")), None))
            if stopped is not None and engine.workers[stopped] is None:
                engine.start_worker(stopped)
        ran = engine.wait_runs(nights, 5)
        saved = engine.call(lambda c: c.read_variable_by_name(history_variable(target)).value)
        ledger = engine.call(lambda c: read_ledger(c, target.host.hostname))
        launches = len(runs(target))
    finally:
        xid_on.unlink(missing_ok=True)
        stop_all(target)
        if stopped is not None and engine.workers[stopped] is None:
            engine.start_worker(stopped)
        engine.wait_workers_online()
    *recovered, stormy = ran
    assert [r.state.name for r in recovered] == ["Recovered"] * 3, [(r.name, r.state.message) for r in ran]
    assert None not in workers[:2] and workers[0] != workers[1], f"nights 1 and 2 on two workers: {workers}\n{engine.submissions()}"
    (gpu,) = ledger.gpus
    assert (gpu.bus_id, gpu.flow_run) == ("00000000:00:06.0", str(ran[0].id)), "the first night's worker ledgered GPU 0"
    assert placed[:3] == ["CUDA_VISIBLE_DEVICES=1"] * 3, f"every relaunch on the spare, the other worker's too: {placed}"
    assert stormy.state.name == "Escalated", stormy.state.message
    message = stormy.state.message
    assert ": restart storm: crashed/error returned 3 times within 72 h, each time from no checkpoint" in message, message
    assert message.count("ended healthy") == 2, f"the storm names both earlier nights of its cause: {message}"
    assert launches == 7, "4 crashed launches and 3 relaunches: none on the fourth night"
    assert [n["flow_run"] for n in saved["nights"]] == [str(r.id) for r in ran], (
        "each worker's run wrote its night where the others read it"
    )
    assert [(n["cause"], n["ended"]) for n in saved["nights"]] == [("gpu_fault", "healthy")] + [("error", "healthy")] * 2 + [
        ("error", "crashed")
    ], saved
