"""The recovery is safe under faults and bad input: each fault is injected for real, each test is a row of
docs/fault-matrix.md (rendered from the @case registry; the last test checks the file matches)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import tests.test_fleet_failures  # noqa: E402,F401 - its rows belong to the matrix too
import tests.test_gang  # noqa: E402,F401
import tests.test_link_drop  # noqa: E402,F401
import tests.test_multirank  # noqa: E402,F401
import tests.test_never_lose_work  # noqa: E402,F401 - its rows belong to the matrix too
from relaunch.config import Target
from relaunch.demo.target import git
from relaunch.demo.wheels import write_wheel
from relaunch.errors import CommandFailed, HostBusy, PreflightFailed
from relaunch.flows.recover import recover_training
from relaunch.plans.lock import lock_path
from relaunch.plans.rebuild_venv import BUILDING_MARKER
from relaunch.plans.rollback_venv import plan_rollback
from relaunch.records.report import Report
from relaunch.steps import LaunchDetail
from relaunch.tasks.launch import launch
from relaunch.tasks.rebuild_venv import rebuild_venv
from relaunch.tasks.rollback_venv import rollback_venv
from relaunch.tasks.stop import stop
from relaunch.tasks.warm_cache import warm_cache
from relaunch.testing.faults import (
    BAD_INPUT,
    DOC,
    LOST,
    MID_STEP,
    ONE,
    REGISTRY,
    RELAUNCH,
    RESUMABLE,
    ROOT,
    big_wheel,
    bin_without,
    case,
    cli_env,
    dead_pid,
    diff,
    kill_group,
    live_supervisor_groups,
    live_trainers,
    making,
    reap,
    reference,
    render_matrix,
    start_cli,
    start_time,
    tmpfs,
    tmux_session_alive,
    tree,
    wait_for,
    write_target,
)
from relaunch.testing.targets import current_log, finished, runs, shell_target, step_detail
from relaunch.vocabulary import Action, Cause, Verdict

pytestmark = pytest.mark.usefixtures("prefect_harness")

HOST = socket.gethostname()
CLI_TIMEOUT = 180

# A trainer that resumes from a checkpoint folder: reads (never writes) the step it records.
RESUME_SH = """#!/usr/bin/env bash
start=0
[ -n "$1" ] && start=$(cat "$1/step")
exec bash stepper.sh "$start"
"""

# Imported by the venv's import check: with FAULT_GATE set it announces itself and blocks (a slow import of torch).
GATE_PY = """import os, pathlib, time
gate = os.environ.get("FAULT_GATE")
if gate:
    pathlib.Path(gate, "import-entered").touch()
    while not pathlib.Path(gate, "open").exists():
        time.sleep(0.05)
"""

# A warm-up that, with FAULT_GATE set, writes half a cache, announces itself and blocks.
GATED_WARMUP = """if [ -n "$FAULT_GATE" ]; then
  echo half > "$TORCHINDUCTOR_CACHE_DIR/half-written.bin"
  touch "$FAULT_GATE/warmup-entered"
  until [ -e "$FAULT_GATE/open" ]; do sleep 0.05; done
fi
echo warmed > "$TORCHINDUCTOR_CACHE_DIR/kernel.bin"
"""

BROKEN_TRAINER = "python3 -c \"import json; json.loads('{broken')\""


# ---------------------------------------------------------------------------------------------
# Set-up helpers and fixtures


def root_of(target: Target) -> Path:
    return Path(target.repo_dir).parent


def commit(target: Target, files: dict[str, str]) -> None:
    for name, text in files.items():
        (Path(target.repo_dir) / name).write_text(text)
    git(Path(target.repo_dir), "add", *files)
    git(Path(target.repo_dir), "commit", "-q", "-m", "test files")


def lived_in(target: Target, logs: bool = True) -> None:
    """What a real host has before a recovery: the user's venv, an uncommitted edit, checkpoints, a cache, old logs."""
    venv = Path(target.venv_dir)
    subprocess.run(["uv", "venv", "-q", "--python", target.python, str(venv)], check=True)
    (venv / "mine").write_text("the user's venv\n")
    (Path(target.repo_dir) / "model.py").write_text("VALUE = 2  # uncommitted experiment\n")
    for step in (100, 600):
        ckpt = Path(target.checkpoint_dir) / f"step_{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "step").write_text(f"{step}\n")
        (ckpt / "weights.bin").write_bytes(os.urandom(64 << 10))
    # Laid out as inductor lays out its cache: code in two-character hash folders.
    (Path(target.inductor_cache_dir) / "st").mkdir(parents=True, exist_ok=True)
    (Path(target.inductor_cache_dir) / "st" / "cstale.so").write_text("old kernel")
    if logs:
        Path(target.log_dir).mkdir(parents=True, exist_ok=True)
        (Path(target.log_dir) / "earlier-run.log").write_text("step=1 loss=9.9\n")


def host_tree(target: Target, *, state: bool = True, live: tuple[Path, ...] = (), skip: tuple[Path, ...] = ()) -> dict[str, str]:
    """The target's whole folder (repo with .git, venvs, logs, checkpoints, cache, state), minus the lock's own files
    and the health poll's bookkeeping (RUN/scan*: how far it has read the log, and the failures found so far;
    RUN/poll_mark: when a waiting poll began; RUN/poll_size: how far it read the log; RUN/tree: the run's PIDs seen so far; RUN/log_followed: a renamed log; RUN/journal: what each poll saw;
    RUN/progress and RUN/recorder_*: the progress record its recorder keeps beside the run)."""
    root = root_of(target)
    t = tree(root, skip=skip + (() if state else (Path(target.state_path),)), live=live)
    lock = Path(lock_path(target)).relative_to(root).as_posix()
    return {path: kind for path, kind in t.items() if not path.startswith(lock) and not POLL_SCAN.search(path)}


POLL_SCAN = re.compile(
    r"/runs/[^/]+/(scan(_matches|\.lock|\.tmp)?|poll_mark|poll_size|tree(\.tmp)?|log_followed|journal(\.tmp)?|progress(\.tmp)?|recorder(_pid|\.lock))$"
)


def launch_detail(report: Report, attempt: int = 0) -> LaunchDetail:
    return step_detail(report, "launch", attempt)


def venv_family(target: Target) -> dict[str, dict[str, str]]:
    """The venv and every venv kept beside it (`VENV.old-*`, `.failed-*`, ...), each as a tree of hashes."""
    venv = Path(target.venv_dir)
    return {p.name: tree(p) for p in sorted(venv.parent.glob(venv.name + "*")) if p.is_dir()}


def venvs_beside(target: Target, kind: str) -> list[Path]:
    venv = Path(target.venv_dir)
    return sorted(venv.parent.glob(f"{venv.name}.{kind}-*"))


@pytest.fixture
def made(tmp_path):
    """Build shell targets (trainer resumes from the newest checkpoint); every trainer and session they start is stopped afterwards, even on failure."""
    with making(
        tmp_path, after=lambda t: commit(t, {"resume.sh": RESUME_SH}), launch_command="bash resume.sh", resume_arg="{checkpoint}"
    ) as make:
        yield make


@pytest.fixture(scope="session")
def api_url(prefect_harness) -> str:
    """The session's test server: CLI subprocesses report to it instead of starting an ephemeral server each."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


@dataclass
class Recovered:
    target: Target
    report: Report
    checkpoints_before: dict[str, str]
    venv_before: dict[str, str]


@pytest.fixture(scope="module")
def recovered(tmp_path_factory, prefect_harness):
    """One full recovery of a lived-in host whose trainer resumes from its newest checkpoint."""
    target = shell_target(tmp_path_factory.mktemp("recovered"), launch_command="bash resume.sh", resume_arg="{checkpoint}")
    commit(target, {"resume.sh": RESUME_SH})
    lived_in(target)
    checkpoints, venv = tree(Path(target.checkpoint_dir)), tree(Path(target.venv_dir))
    try:
        yield Recovered(target, recover_training(target), checkpoints, venv)
    finally:
        try:
            stop.fn(target)
        finally:
            reap(target)


@pytest.fixture(scope="module")
def crash_loop(tmp_path_factory, prefect_harness):
    """A trainer that raises at once, every time: the flow acts twice, then escalates."""
    target = shell_target(tmp_path_factory.mktemp("crash-loop"), launch_command=BROKEN_TRAINER, max_attempts=5)
    try:
        yield target, finished(recover_training, target=target)
    finally:
        try:
            stop.fn(target)
        finally:
            reap(target)


def kill_orchestrator_when(target: Target, work: Path, api_url: str, ready, what: str, *flags: str) -> str:
    """Run `relaunch recover TARGET.yaml` as a real process; SIGKILL it (and the host commands it runs) once ready(gate)."""
    gate = work / "gate"
    gate.mkdir(parents=True)
    output = work / "orchestrator.out"
    proc = start_cli(
        ["recover", *flags, str(write_target(target, work / "target.yaml"))],
        cli_env(work / "prefect-home", api_url, FAULT_GATE=str(gate)),
        output,
    )
    GATES.append(gate)
    try:
        wait_for(lambda: ready(gate) or proc.poll() is not None, CLI_TIMEOUT, what)
        assert proc.poll() is None, f"the orchestrator ended before {what}:\n{output.read_text()[-3000:]}"
    finally:
        # What a SIGKILLed worker loses: its own process group. Host commands under `timeout` lead
        # their own groups and run on, blocked at the gate until the next recovery stops them.
        kill_group(proc)
    return output.read_text()


GATES: list[Path] = []


@pytest.fixture(autouse=True)
def open_gates_at_teardown():
    """Whatever a test leaves blocked at a gate may finish once the test is over."""
    yield
    while GATES:
        (GATES.pop() / "open").touch()


def leftovers(target: Target) -> list[int]:
    """PIDs of tracked host commands (STATE/inflight records) still alive with their recorded start time."""
    folder = Path(target.state_path) / "inflight"
    alive = []
    for rec in sorted(folder.iterdir()) if folder.is_dir() else []:
        pid, start = rec.read_text().split()[:2]
        if start_time(int(pid)) == start:
            alive.append(int(pid))
    return alive


def stopped_leftovers(report: Report) -> list[str]:
    return next(s.detail.stopped for s in report.preflight if s.step == "stop_leftovers")


# ---------------------------------------------------------------------------------------------
# 1. Nothing is lost


@case(
    LOST,
    "a rebuilt venv turns out bad after the recovery: the lock moved to a bad release (tinyjunk 0.2.0 imports fine, so the rebuild's import check passes, and raises when used)",
    "`relaunch rollback-venv TARGET.yaml` (one command, exit 0) puts the newest `VENV.old-*` back with its files intact (the good release works again) and keeps the bad one as `VENV.rolled-back-STAMP`",
)
def test_a_rebuilt_venv_is_rolled_back_with_one_command_and_the_previous_venv_is_intact(made, tmp_path, api_url, monkeypatch):
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))  # the bad release stays out of the shared cache
    t = made()
    venv = Path(t.venv_dir)
    rebuild_venv.fn(t)  # the user's good venv, from the lock: tinyjunk 0.1.0
    (venv / "mine").write_text("the user's venv\n")
    before = tree(venv)
    use = [str(venv / "bin" / "python"), "-c", "import tinyjunk; getattr(tinyjunk, 'step', lambda: None)(); print(tinyjunk.__version__)"]
    # The fault: a bad release reaches the lock, and the next recovery's rebuild installs it.
    bad_release = b"__version__ = '0.2.0'\n\ndef step():\n    raise RuntimeError('tinyjunk 0.2.0 regression')\n"
    write_wheel(Path(t.find_links[0]), "tinyjunk", "0.2.0", {"tinyjunk/__init__.py": bad_release})
    Path(t.lock_path).write_text("tinyjunk==0.2.0\n")
    rebuild_venv.fn(t)
    assert not (venv / "mine").exists()
    bad = subprocess.run(use, capture_output=True, text=True)
    assert bad.returncode != 0 and "tinyjunk 0.2.0 regression" in bad.stderr, "the rebuilt venv is bad"
    file = write_target(t, tmp_path / "target.yaml")
    proc = subprocess.run(
        [RELAUNCH, "rollback-venv", str(file)],
        env=cli_env(tmp_path / "prefect-home", api_url),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert tree(venv) == before, "the previous venv came back exactly as it was"
    rolled = venvs_beside(t, "rolled-back")
    assert len(rolled) == 1 and f"the replaced venv is kept as {rolled[0]}" in proc.stdout, proc.stdout
    assert list(rolled[0].glob("lib/python*/site-packages/tinyjunk-0.2.0.dist-info")), "the bad venv is kept aside for a look"
    assert venvs_beside(t, "old") == [] and not Path(lock_path(t)).exists()
    good = subprocess.run(use, capture_output=True, text=True)
    assert (good.returncode, good.stdout.strip()) == (0, "0.1.0"), good.stderr
    assert plan_rollback(t, "S").argv[-3:] == (t.venv_dir, "S", t.state_path), "values reach the script as arguments"


@case(
    LOST,
    "a rollback asked for while the trainer runs on the venv, or with no previous venv kept aside",
    "refused with CommandFailed saying why; the venv is untouched",
)
def test_a_rollback_that_is_not_safe_is_refused_and_changes_nothing(made):
    t = made()
    rebuild_venv.fn(t)  # there was no venv before: nothing kept aside
    before = venv_family(t)
    with pytest.raises(CommandFailed, match="nothing to roll back to"):
        rollback_venv.fn(t)
    assert venv_family(t) == before
    rebuild_venv.fn(t)  # now one is kept aside, and a trainer runs on the venv
    record, _ = launch.fn(t, 1)
    before = venv_family(t)
    with pytest.raises(CommandFailed, match=f"PID {record.pid}.*stop it before rolling the venv back"):
        rollback_venv.fn(t)
    assert venv_family(t) == before and live_trainers(t) == [(record.run_id, record.pid)]


@case(
    LOST,
    "uncommitted edits to the restored model code",
    "saved as `STATE/patches/STAMP-restore.patch` before the restore; it re-applies cleanly with `git apply`",
)
def test_a_recovery_saves_uncommitted_edits_as_a_patch_that_reapplies_cleanly(recovered, tmp_path):
    t, report = recovered.target, recovered.report
    assert report.verdict is Verdict.HEALTHY, report.timeline()
    restore = next(s.detail for s in report.attempts[0].steps if s.step == "restore_code")
    assert (Path(t.repo_dir) / "model.py").read_text() == "VALUE = 1\n"
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", t.repo_dir, str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "apply", "--check", restore.patch], check=True)
    subprocess.run(["git", "-C", str(clone), "apply", restore.patch], check=True)
    assert (clone / "model.py").read_text() == "VALUE = 2  # uncommitted experiment\n"


@case(
    LOST,
    "a full recovery replaces the user's venv; then two more full recoveries (three rebuilds)",
    "the old venv is moved aside as `VENV.old-STAMP`, byte for byte; the last two are kept, byte for byte, and only the oldest is pruned",
)
def test_a_recovery_keeps_the_users_previous_venv_aside_byte_for_byte(recovered, made):
    t = recovered.target
    old = venvs_beside(t, "old")
    assert len(old) == 1 and tree(old[0]) == recovered.venv_before
    # Three rebuilds in a row: each venv, marked so that no two are alike, goes aside; only the oldest is pruned.
    t = made()
    lived_in(t)
    venv = Path(t.venv_dir)
    generations, asides = [tree(venv)], []
    for n in range(1, 4):
        report = recover_training(t, force=n > 1)
        assert report.verdict is Verdict.HEALTHY, report.timeline()
        rebuild = next(s.detail for s in report.attempts[0].steps if s.step == "rebuild_venv")
        asides.append(rebuild.old_venv)
        assert rebuild.pruned == ([asides[0]] if n == 3 else []), rebuild
        (venv / "generation").write_text(f"{n}\n")
        generations.append(tree(venv))
    kept = venvs_beside(t, "old")
    assert [str(p) for p in kept] == asides[1:] and not Path(asides[0]).exists(), "the oldest pruned, the last two kept"
    assert [tree(p) for p in kept] == generations[1:3], "the last two are intact, byte for byte"
    assert "mine" in generations[0] and len({str(g) for g in generations}) == 4


@case(
    LOST,
    "a recovery that relaunches from a checkpoint, then a stop",
    "sha256 of every file in `checkpoint_dir` is the same before, after the recovery (resumed from the newest) and after the stop",
)
def test_checkpoints_are_never_modified_or_deleted_by_a_recovery_that_resumes_from_one_nor_by_stop(recovered):
    t, report = recovered.target, recovered.report
    assert report.verdict is Verdict.HEALTHY, report.timeline()
    detail = launch_detail(report)
    assert detail.checkpoint == f"{t.checkpoint_dir}/step_600"
    assert "step=601 " in Path(detail.log_path).read_text(), "the trainer really resumed from the checkpoint"
    assert tree(Path(t.checkpoint_dir)) == recovered.checkpoints_before
    stop.fn(t)
    assert live_trainers(t) == []
    assert tree(Path(t.checkpoint_dir)) == recovered.checkpoints_before


@case(
    LOST,
    "a run of several attempts (the trainer crashes after each launch)",
    "every attempt's log exists, is non-empty and holds that attempt's own output",
)
def test_every_attempts_log_is_kept(crash_loop):
    t, report = crash_loop
    launched = [a.run_id for a in report.attempts if a.run_id]
    assert len(launched) == 2 and runs(t) == sorted(launched)
    for run in launched:
        log = Path((Path(t.state_path) / "runs" / run / "log_path").read_text().strip())
        text = log.read_text()
        assert f"run {run}: start" in text and "JSONDecodeError" in text, log


# ---------------------------------------------------------------------------------------------
# 2. Never two trainers


@case(
    ONE,
    "two recoveries of the same target started at the same instant (two threads, one barrier)",
    "one recovers, the other is refused (HostBusy) or finds it healthy; exactly one trainer PID and one supervisor group alive",
)
def test_two_recoveries_started_at_once_leave_exactly_one_trainer(made):
    t = made()
    barrier, outcomes = threading.Barrier(2), [None, None]

    def recover(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = recover_training(t)
        except Exception as exc:  # noqa: BLE001 - the outcome is what we check
            outcomes[i] = exc

    threads = [threading.Thread(target=recover, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(CLI_TIMEOUT)
    reports = [o for o in outcomes if isinstance(o, Report)]
    assert reports and all(r.verdict is Verdict.HEALTHY for r in reports), outcomes
    assert all(isinstance(o, (Report, HostBusy)) for o in outcomes), outcomes
    assert len(live_trainers(t)) == 1 and len(live_supervisor_groups(t)) == 1
    assert len(runs(t)) == 1, "only one launch happened"


@case(
    ONE,
    "six recoveries (`recover_training --force`, six threads, one barrier) race to take over the same stale lock (dead owner), two rounds",
    "each round exactly one takes the lock and recovers (healthy); every other one gets HostBusy, no other error; one trainer at the end, one launch per round",
)
def test_several_recoveries_racing_for_a_stale_lock_let_exactly_one_in(made, tmp_path, monkeypatch):
    # The winner holds the lock at its warm-up's gate until the five others have ended, so none can come late
    # to a free lock; --force makes every round a full recovery (with the warm-up) though the trainer is healthy.
    t = made(warmup_command=GATED_WARMUP)
    lock = Path(lock_path(t))
    rounds = 2  # 12 real recoveries in all (~8-20 s a round): each round is six flow runs on a 2-core runner
    for r in range(rounds):
        lock.mkdir(parents=True)
        (lock / "owner").write_text(f"{HOST} {dead_pid()} killed-flow-run\n")
        gate = tmp_path / f"gate-{r}"
        gate.mkdir()
        GATES.append(gate)
        monkeypatch.setenv("FAULT_GATE", str(gate))
        start, outcomes = threading.Barrier(6), {}

        def contend(i: int) -> None:
            start.wait()
            try:
                outcomes[i] = recover_training(t, force=True)
            except BaseException as exc:  # noqa: BLE001 - every outcome is checked below
                outcomes[i] = exc

        threads = [threading.Thread(target=contend, args=(i,), daemon=True) for i in range(6)]
        for th in threads:
            th.start()
        try:
            # Five end (HostBusy) while the sixth rebuilds; it then reaches its warm-up's gate, still holding the lock.
            wait_for(
                lambda: len(outcomes) >= 5 and (gate / "warmup-entered").exists(),
                CLI_TIMEOUT,
                "five recoveries to end, the sixth at its warm-up",
            )
            inside = [i for i in range(6) if i not in outcomes]
            assert len(inside) == 1 and (gate / "warmup-entered").exists(), (
                f"round {r}: one recovery holds the lock at its warm-up while the others end: {outcomes}"
            )
        finally:
            (gate / "open").touch()
            for th in threads:
                th.join(CLI_TIMEOUT)
        assert not any(th.is_alive() for th in threads), f"round {r}: a recovery is still running"
        reports = [o for o in outcomes.values() if isinstance(o, Report)]
        refused = [o for o in outcomes.values() if not isinstance(o, Report)]
        assert len(reports) == 1 and reports[0].verdict is Verdict.HEALTHY, f"round {r}: {outcomes}"
        assert len(refused) == 5 and all(type(o) is HostBusy for o in refused), (
            f"round {r}: every loser gets HostBusy, nothing else: {refused}"
        )
        assert outcomes[inside[0]] is reports[0], "the one that held the lock is the one that recovered"
        assert not lock.exists(), f"round {r}: the winner released the lock"
    assert len(runs(t)) == rounds, "one launch per round"
    assert len(live_trainers(t)) == 1 and len(live_supervisor_groups(t)) == 1


@case(
    ONE,
    "a recovery started while a healthy run goes on",
    "action `none`; the same trainer PID runs on; no new run, nothing on the host changed",
)
def test_a_recovery_started_while_a_healthy_run_goes_on_leaves_it_alone(made):
    t = made()
    record, _ = launch.fn(t, 1)
    before = host_tree(t, live=(Path(record.log_path),))
    report = recover_training(t)
    assert [a.action for a in report.attempts] == [Action.NONE] and report.verdict is Verdict.HEALTHY
    assert live_trainers(t) == [(record.run_id, record.pid)]
    assert diff(before, host_tree(t, live=(Path(record.log_path),))) == []


@case(
    ONE,
    "a stale lock left by a killed orchestrator (`STATE/lock.d/owner`: this host, a dead PID)",
    "taken over; the recovery ends healthy with one trainer and releases the lock",
)
def test_a_stale_lock_of_a_killed_orchestrator_is_taken_over_and_the_recovery_ends_healthy(made):
    t = made()
    lock = Path(lock_path(t))
    lock.mkdir(parents=True)
    (lock / "owner").write_text(f"{HOST} {dead_pid()} killed-flow-run\n")
    report = recover_training(t)
    assert report.ok and report.verdict is Verdict.HEALTHY, report.timeline()
    assert len(live_trainers(t)) == 1 and not lock.exists()


@case(
    ONE,
    "a live lock (owner: this host, a live PID)",
    "HostBusy naming the holder (host, PID, flow run); the lock and everything else unchanged",
)
def test_a_live_lock_is_refused_with_host_busy_naming_the_holder_and_nothing_changes(made):
    t = made()
    lived_in(t)
    holder = subprocess.Popen(["sleep", "infinity"])  # stands in for a live orchestrator
    try:
        lock = Path(lock_path(t))
        lock.mkdir(parents=True)
        owner = f"{HOST} {holder.pid} other-flow-run"
        (lock / "owner").write_text(owner + "\n")
        before = host_tree(t)
        with pytest.raises(HostBusy) as err:
            recover_training(t)
        assert owner in str(err.value) and str(lock) in str(err.value)
        assert (lock / "owner").read_text() == owner + "\n"
        assert diff(before, host_tree(t)) == []
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------------------------------------
# 3. Idempotent and resumable


@case(RESUMABLE, "`recover` run twice in a row", "the second does nothing (action `none`): same trainer, every file on the host identical")
def test_recovering_twice_in_a_row_changes_nothing_the_second_time(made):
    t = made()
    lived_in(t)
    assert recover_training(t).verdict is Verdict.HEALTHY
    log = current_log(t)
    before, trainers = host_tree(t, live=(log,)), live_trainers(t)
    second = recover_training(t)
    assert [a.action for a in second.attempts] == [Action.NONE] and second.verdict is Verdict.HEALTHY
    assert live_trainers(t) == trainers and len(trainers) == 1
    assert diff(before, host_tree(t, live=(log,))) == []


@case(
    RESUMABLE,
    "orchestrator (`relaunch recover`) SIGKILLed inside build_venv, as a killed worker is: its process group dies, the import check it started runs on under `timeout` (the venv built aside, `VENV.new-*`, marked `.relaunch-building`)",
    "recover again: first stops the leftover by its recorded PID and group, then healthy, one trainer; the half-built venv is kept aside as `VENV.incomplete-*`, never used; the user's venv still kept",
)
def test_an_orchestrator_killed_while_rebuilding_the_venv_is_resumed_and_the_half_built_venv_is_never_used(made, tmp_path, api_url):
    t = made(import_check=["tinyjunk", "gate"])
    commit(t, {"gate.py": GATE_PY})
    lived_in(t)
    venv = Path(t.venv_dir)
    kill_orchestrator_when(
        t,
        tmp_path / "kill",
        api_url,
        lambda g: (g / "import-entered").exists() and any((p / BUILDING_MARKER).exists() for p in venvs_beside(t, "new")),
        "the import check inside build_venv",
    )
    assert [p for p in venvs_beside(t, "new") if (p / BUILDING_MARKER).exists()], "killed mid-build, the aside venv half-built"
    assert (venv / "mine").exists() and Path(lock_path(t)).exists(), "the user's venv untouched by the build; lock left behind"
    orphans = leftovers(t)
    assert orphans, "the import check outlived the orchestrator, as it does when a worker is SIGKILLed"
    report = recover_training(t)
    assert report.verdict is Verdict.HEALTHY, report.timeline()
    assert stopped_leftovers(report) and not any(start_time(p) for p in orphans), "the next recovery stopped the leftover first"
    assert not (venv / BUILDING_MARKER).exists()
    incomplete = venvs_beside(t, "incomplete")
    assert len(incomplete) == 1 and (incomplete[0] / BUILDING_MARKER).exists()
    assert [p for p in venvs_beside(t, "old") if (p / "mine").exists()], "the user's venv is still kept aside"
    assert len(live_trainers(t)) == 1 and len(live_supervisor_groups(t)) == 1
    assert not Path(lock_path(t)).exists()


@case(
    RESUMABLE,
    "orchestrator SIGKILLed during the warm-up, as a killed worker is: the warm-up runs on under `timeout` (cache half written)",
    "recover again: first stops the leftover warm-up by its recorded PID and group, then healthy, one trainer; the cache is the fresh warm-up's alone",
)
def test_an_orchestrator_killed_during_warm_up_is_resumed_with_a_fresh_cache(made, tmp_path, api_url):
    t = made(warmup_command=GATED_WARMUP)
    lived_in(t)
    cache = Path(t.inductor_cache_dir)
    kill_orchestrator_when(t, tmp_path / "kill", api_url, lambda g: (g / "warmup-entered").exists(), "the warm-up to start")
    assert (cache / "half-written.bin").exists() and not (cache / "kernel.bin").exists()
    orphans = leftovers(t)
    assert orphans, "the warm-up outlived the orchestrator, as it does when a worker is SIGKILLed"
    report = recover_training(t)
    assert report.verdict is Verdict.HEALTHY, report.timeline()
    assert stopped_leftovers(report) and not any(start_time(p) for p in orphans), "the next recovery stopped the leftover first"
    assert (cache / "kernel.bin").read_text() == "warmed\n"
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".relaunch-")) == ["kernel.bin"]
    assert not (Path(t.venv_dir) / BUILDING_MARKER).exists()
    assert len(live_trainers(t)) == 1 and len(live_supervisor_groups(t)) == 1


@case(
    RESUMABLE,
    "a healthy run; `relaunch recover --force` SIGKILLed inside build_venv (the new venv half-built aside, the trainer not yet stopped)",
    "the trainer runs on untouched; the next `recover` changes nothing; the next forced one keeps the half-built venv aside as `.incomplete-*` and ends healthy with one trainer",
)
def test_a_forced_recovery_killed_mid_build_leaves_the_healthy_run_running(made, tmp_path, api_url):
    t = made(import_check=["tinyjunk", "gate"])
    commit(t, {"gate.py": GATE_PY})
    lived_in(t)
    assert recover_training(t).verdict is Verdict.HEALTHY
    trainers = live_trainers(t)
    venv = Path(t.venv_dir)
    kill_orchestrator_when(
        t,
        tmp_path / "kill",
        api_url,
        lambda g: (g / "import-entered").exists() and any((p / BUILDING_MARKER).exists() for p in venvs_beside(t, "new")),
        "the import check inside build_venv",
        "--force",
    )
    assert live_trainers(t) == trainers, "the build runs aside before the stop: the healthy trainer was never stopped"
    calm = recover_training(t)
    assert [a.action for a in calm.attempts] == [Action.NONE] and live_trainers(t) == trainers, calm.timeline()
    report = recover_training(t, force=True)
    assert report.verdict is Verdict.HEALTHY and not (venv / BUILDING_MARKER).exists(), report.timeline()
    assert len(venvs_beside(t, "incomplete")) == 1, "the half-built venv is kept aside, never used"
    assert len(live_trainers(t)) == 1 and len(live_supervisor_groups(t)) == 1


@case(
    RESUMABLE,
    "a healthy run; `relaunch recover --force` SIGKILLed during the warm-up (cache a third written, marked `.relaunch-warming`)",
    "the next `recover` sees the marker and re-warms before relaunching (not a plain relaunch onto the partial cache): healthy, one trainer, a complete cache",
)
def test_a_recovery_killed_mid_warm_up_from_a_healthy_run_is_finished_by_the_next_one(made, tmp_path, api_url):
    t = made(warmup_command=GATED_WARMUP)
    lived_in(t)
    assert recover_training(t).verdict is Verdict.HEALTHY
    cache = Path(t.inductor_cache_dir)
    kill_orchestrator_when(t, tmp_path / "kill", api_url, lambda g: (g / "warmup-entered").exists(), "the warm-up to start", "--force")
    assert (cache / ".relaunch-warming").exists()
    report = recover_training(t)
    first = report.attempts[0]
    assert "interrupted during warm_cache" in first.why and "warm_cache" in [s.step for s in first.steps], report.timeline()
    assert report.verdict is Verdict.HEALTHY
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".relaunch-")) == ["kernel.bin"]
    assert not (cache / ".relaunch-warming").exists()
    assert len(live_trainers(t)) == 1 and len(live_supervisor_groups(t)) == 1


@case(
    RESUMABLE,
    "orchestrator SIGKILLed right after the launch (trainer's PID recorded)",
    "recover again: finds the trainer healthy and leaves it (action `none`): the same single trainer",
)
def test_an_orchestrator_killed_right_after_launch_is_resumed_without_a_second_trainer(made, tmp_path, api_url):
    t = made()
    pids = lambda g: list((Path(t.state_path) / "runs").glob("*/pid"))  # noqa: E731
    kill_orchestrator_when(t, tmp_path / "kill", api_url, pids, "the trainer's PID record")
    first = live_trainers(t)
    assert len(first) == 1
    report = recover_training(t)
    assert report.verdict is Verdict.HEALTHY and report.attempts[-1].action is Action.NONE, report.timeline()
    assert live_trainers(t) == first and len(runs(t)) == 1


# ---------------------------------------------------------------------------------------------
# 4. Bad input: a clear error naming what and where; the host unchanged


@case(
    BAD_INPUT,
    "target file with wrong types (`max_attempts: three`, `thresholds.poll_interval_seconds: often`) and a missing field (`launch_command`)",
    "`relaunch recover` exits 2 naming the file and every bad field; nothing on the host touched",
)
def test_a_target_file_with_wrong_types_and_missing_fields_exits_2_naming_the_file_and_each_field(made, tmp_path):
    t = made()
    lived_in(t)
    data = t.model_dump(mode="json")
    data["max_attempts"] = "three"
    data["thresholds"]["poll_interval_seconds"] = "often"
    del data["launch_command"]
    file = tmp_path / "bad-target.yaml"
    file.write_text(yaml.safe_dump(data))
    before = host_tree(t)
    proc = subprocess.run(
        [RELAUNCH, "recover", str(file)], env=cli_env(tmp_path / "prefect-home"), capture_output=True, text=True, timeout=CLI_TIMEOUT
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for needle in (str(file), "max_attempts", "thresholds.poll_interval_seconds", "launch_command: Field required"):
        assert needle in proc.stderr, (needle, proc.stderr)
    assert diff(before, host_tree(t)) == [] and not Path(t.state_path).exists()


@case(
    BAD_INPUT,
    "`known_good_ref` that is not a commit in the repo",
    "PreflightFailed naming the ref, the repo and the host, before any change",
)
def test_an_unknown_git_ref_fails_preflight_naming_it_and_the_repo_and_changes_nothing(made):
    t = made(known_good_ref="no-such-ref")
    lived_in(t)
    before = host_tree(t, state=False)
    with pytest.raises(PreflightFailed) as err:
        recover_training(t)
    assert f"known_good_ref 'no-such-ref' is not a commit in {t.repo_dir}" in str(err.value) and "on local" in str(err.value)
    assert diff(before, host_tree(t, state=False)) == [] and runs(t) == []


@case(BAD_INPUT, "`lock_file` that does not exist", "PreflightFailed naming the lock's full path, before any change")
def test_a_missing_lock_file_fails_preflight_naming_its_path_and_changes_nothing(made):
    t = made(lock_file="missing.lock")
    lived_in(t)
    before = host_tree(t, state=False)
    with pytest.raises(PreflightFailed, match=f"lock_file {t.repo_dir}/missing.lock does not exist"):
        recover_training(t)
    assert diff(before, host_tree(t, state=False)) == [] and runs(t) == []


@case(
    BAD_INPUT,
    "a lock that cannot be installed (`tinyjunk==9.9.9`, not in the wheels)",
    "CommandFailed naming `uv pip sync` and the package; the old venv is put back byte for byte (the failed one kept as `VENV.failed-*`); code not restored, nothing launched",
)
def test_a_lock_that_cannot_be_installed_fails_naming_the_installer_and_puts_the_old_venv_back(made):
    t = made()
    lived_in(t)
    Path(t.lock_path).write_text("tinyjunk==9.9.9\n")
    before = host_tree(t, state=False)
    with pytest.raises(CommandFailed) as err:
        recover_training(t)
    assert err.value.command.startswith("uv pip sync ") and "tinyjunk" in err.value.output_tail and "9.9.9" in str(err.value)
    failed = venvs_beside(t, "failed")
    assert len(failed) == 1
    assert diff(before, host_tree(t, state=False, skip=(failed[0],))) == [] and runs(t) == []


@case(
    BAD_INPUT,
    "a warm-up command that fails (prints, then exits 3)",
    "CommandFailed naming `warm-up`, exit code 3 and its output tail; nothing launched; the old venv and the edits stay kept aside",
)
def test_a_failing_warm_up_fails_naming_warm_up_its_exit_code_and_output_tail_and_launches_nothing(made):
    t = made(warmup_command="echo compiling kernel 7 of 9; echo 'RuntimeError: inductor kernel 7 failed' >&2; exit 3")
    lived_in(t)
    with pytest.raises(CommandFailed) as err:
        recover_training(t)
    e = err.value
    assert (e.command, e.exit_code) == ("warm-up", 3) and "on local" in str(e)
    assert "compiling kernel 7 of 9" in str(e) and "RuntimeError: inductor kernel 7 failed" in str(e)
    assert runs(t) == [] and not tmux_session_alive(t.tmux_session)
    assert [p for p in venvs_beside(t, "old") if (p / "mine").exists()]
    assert list((Path(t.state_path) / "patches").glob("*-restore.patch"))


@case(
    BAD_INPUT,
    "a launch command that exits at once (raises `JSONDecodeError`)",
    "the report says `crashed` with the real exception line, acts once more, then escalates on the same failure: two launches, no loop",
)
def test_a_launch_command_that_exits_at_once_is_reported_crashed_with_its_exception_then_escalated(crash_loop):
    t, report = crash_loop
    assert [a.action for a in report.attempts] == [Action.FULL_RECOVERY, Action.FULL_RECOVERY, Action.ESCALATE], report.timeline()
    crashed = report.attempts[1]
    assert (crashed.verdict, crashed.cause) == (Verdict.CRASHED, Cause.ERROR)
    assert any("JSONDecodeError" in line for line in crashed.evidence), crashed.evidence
    assert not report.ok and "again with no progress" in report.message
    assert len(runs(t)) == 2 and live_trainers(t) == []


@case(
    BAD_INPUT,
    "a `log_dir` that cannot be created (its parent is a file)",
    "PreflightFailed naming `log_dir` and the nearest existing path; nothing created",
)
def test_a_log_dir_that_cannot_be_created_fails_preflight_naming_it_and_changes_nothing(made, tmp_path):
    blocker = tmp_path / "target0" / "not-a-folder"
    t = made(log_dir=str(blocker / "logs"))
    lived_in(t, logs=False)
    blocker.write_text("a file where the log folder's parent should be\n")
    before = host_tree(t)
    with pytest.raises(PreflightFailed) as err:
        recover_training(t)
    assert f"log_dir {blocker}/logs cannot be created (nearest existing: {blocker})" in str(err.value)
    assert diff(before, host_tree(t)) == []


# ---------------------------------------------------------------------------------------------
# 5. Faults during a step


@case(
    MID_STEP,
    "disk full while building the venv (venv on an 8 MiB tmpfs; the lock's wheel carries 12 MiB)",
    "CommandFailed whose tail has the real `No space left on device`; the old venv is put back byte for byte",
)
def test_a_disk_that_fills_while_building_the_venv_fails_with_the_real_error_and_the_old_venv_comes_back(made, tmp_path, monkeypatch):
    wheels = tmp_path / "big-wheels"
    big_wheel(wheels, "bigpkg", "1.0.0", 12)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))  # keep the 12 MiB blob out of the shared cache
    with tmpfs(tmp_path / "small", "8m") as small:
        t = made(venv_dir=str(small / "venv"), find_links=[str(wheels)], import_check=["bigpkg"], min_free_disk_gb=0)
        Path(t.lock_path).write_text("bigpkg==1.0.0\n")
        venv = Path(t.venv_dir)
        subprocess.run(["uv", "venv", "-q", "--python", t.python, str(venv)], check=True)
        (venv / "mine").write_text("the user's venv\n")
        before = tree(venv)
        with pytest.raises(CommandFailed) as err:
            recover_training(t)
        assert err.value.command.startswith("uv pip sync ") and "No space left on device" in err.value.output_tail, str(err.value)
        assert tree(venv) == before
        assert len(venvs_beside(t, "failed")) == 1 and runs(t) == []


@case(
    MID_STEP,
    "the warm-up process killed with SIGKILL (as the OOM killer does)",
    "CommandFailed naming `warm-up` and exit code 137 (128 + SIGKILL), with its output",
)
def test_a_warm_up_killed_by_sigkill_fails_naming_warm_up_and_exit_137(made):
    t = made(
        warmup_command="python3 -c 'import os, signal; print(\"compiling kernels\", flush=True); os.kill(os.getpid(), signal.SIGKILL)'"
    )
    with pytest.raises(CommandFailed) as err:
        warm_cache.fn(t)
    assert err.value.command == "warm-up" and "compiling kernels" in str(err.value)
    assert err.value.exit_code == 137 and "exited 137" in str(err.value), str(err.value)


@case(
    MID_STEP,
    "tmux not installed on the host (`relaunch recover` run with a PATH holding every tool but tmux)",
    "exit 2, preflight names tmux, nothing on the host changed",
)
def test_a_host_without_tmux_fails_preflight_naming_tmux_and_changes_nothing(made, tmp_path, api_url):
    t = made()
    lived_in(t)
    file = write_target(t, tmp_path / "target.yaml")
    env = cli_env(tmp_path / "prefect-home", api_url, PATH=str(bin_without(tmp_path / "bin", "tmux")))
    before = host_tree(t, state=False)
    proc = subprocess.run([RELAUNCH, "recover", str(file)], env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "preflight on local" in proc.stderr and "tmux is not installed" in proc.stderr, proc.stderr
    assert diff(before, host_tree(t, state=False)) == [] and runs(t) == []


reference(
    MID_STEP,
    "SSH connection dropped in the middle of a command",
    "TransportError (retried by the task; a command that failed on the host never is); the next call reconnects",
    "tests/test_ssh_transport.py::test_a_connection_lost_mid_command_raises_transport_error_and_the_next_call_reconnects",
)


# ---------------------------------------------------------------------------------------------
# The table


def test_the_fault_matrix_doc_is_what_the_registry_renders():
    # `RELAUNCH_WRITE_DOCS=1 .venv/bin/python -m pytest tests/test_fault_matrix.py -k fault_matrix_doc` writes the file, then checks it.
    if os.environ.get("RELAUNCH_WRITE_DOCS") == "1":
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_text(render_matrix(REGISTRY))
    own = {c.test.split("::")[1] for c in REGISTRY if c.test.startswith("tests/test_fault_matrix.py::")}
    tests_here = {name for name in globals() if name.startswith("test_")} - {"test_the_fault_matrix_doc_is_what_the_registry_renders"}
    assert own == tests_here, f"tests without a row: {tests_here - own}; rows without a test: {own - tests_here}"
    for c in REGISTRY:
        path, name = c.test.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), f"{c.test} does not exist"
    assert DOC.exists() and DOC.read_text() == render_matrix(REGISTRY), (
        "docs/fault-matrix.md is stale: run `RELAUNCH_WRITE_DOCS=1 .venv/bin/python -m pytest tests/test_fault_matrix.py -k fault_matrix_doc`"
    )
