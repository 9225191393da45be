"""A connection that drops in the middle of a step that is not idempotent (launch, the venv built aside).

The host is a network namespace of its own (relaunch/testing/netns.py); its link is taken down while the step's
command runs there, and the step's first try is held on the host (SIGSTOP of the process group its
STATE/inflight record names) so that "still running when the retry comes" is certain, not a race.
The client sees a dead connection (TransportError), Prefect retries the step once the link is back,
and the retry must look at what the first try left: adopt the trainer it started, or stop its
half-done install before building again. Never two trainers, always a usable venv.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from relaunch.config import Target
from relaunch.flows.recover import recover_training
from relaunch.plans.rebuild_venv import BUILDING_MARKER, BUILT_RECORD
from relaunch.records.report import Report
from relaunch.testing.faults import MID_STEP, ONE, big_wheel, case, live_supervisor_groups, live_trainers, reap, start_time, wait_for
from relaunch.testing.netns import Fleet, fleet_of_hosts
from relaunch.testing.targets import finished, runs, shell_target, step_detail
from relaunch.vocabulary import Verdict
from relaunch.wire.transport import close_all

pytestmark = pytest.mark.usefixtures("prefect_harness")

# Small, so that the client gives a dead link up within seconds (keepalive and TCP_USER_TIMEOUT follow it).
CONNECT_TIMEOUT = 1.0


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Fleet]:
    close_all()
    with fleet_of_hosts(1, tmp_path / "hosts") as fleet:
        try:
            yield fleet
        finally:
            fleet.up(0)
            close_all()


def target_on(fleet: Fleet, tmp_path: Path, **overrides: object) -> Target:
    server = fleet.servers[0]
    host = server.ssh_host(connect_timeout_seconds=CONNECT_TIMEOUT, command_timeout_seconds=120)
    return shell_target(tmp_path / "target", name=f"drop-{uuid.uuid4().hex[:8]}", host=host, **overrides)


def records(target: Target, step_label: str) -> list[tuple[int, str, int]]:
    """(PID, start time, process group) of the host commands of one step still recorded in STATE/inflight.

    A record is named `SLUG.PID`, SLUG the command's label with every other character than a letter or digit
    as `-`, cut at 60 (relaunch/wire/commands.py _slug); `step_label` is how that slug begins, since some labels
    name their paths (`uv pip sync LOCK into VENV.new-STAMP`).
    """
    folder = Path(target.state_path) / "inflight"
    found = []
    for rec in folder.glob(f"{step_label}*") if folder.is_dir() else []:
        try:
            pid, start, pgid = rec.read_text().split()[:3]
        except (OSError, ValueError):
            continue  # being written or removed
        if start_time(int(pid)) == start:
            found.append((int(pid), start, int(pgid)))
    return found


def retrying(target: Target, task: str) -> bool:
    """Prefect has given the step's first try up (a dead connection) and scheduled its retry."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags, TaskRunFilter, TaskRunFilterName

    with get_client(sync_client=True) as client:
        runs_ = client.read_task_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"target:{target.name}"])),
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_=f"{task}@")),
        )
    return any(r.state and (r.state.name in ("AwaitingRetry", "Retrying") or r.run_count > 1) for r in runs_)


@contextmanager
def recovering(target: Target) -> Iterator[Callable[[], Report]]:
    """The recovery in a thread of its own; the yielded function waits for its report."""
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(_run(target)), daemon=True)
    thread.start()

    def report() -> Report:
        thread.join(timeout=240)
        assert not thread.is_alive(), "the recovery did not end within 240 s"
        (result,) = outcome
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[return-value]

    try:
        yield report
    finally:
        thread.join(timeout=240)


def _run(target: Target) -> object:
    try:
        return finished(recover_training, target=target)
    except BaseException as exc:  # noqa: BLE001 - handed to the test
        return exc


def hold(pgid: int) -> None:
    os.killpg(pgid, signal.SIGSTOP)


def release(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def drop_link_while_held(fleet: Fleet, target: Target, label: str, what: str) -> tuple[int, str, int]:
    """Wait for the step's command on the host, hold it there, and take the host's link down."""
    first = wait_for(lambda: records(target, label), 120, what)[0]  # type: ignore[index]
    hold(first[2])
    fleet.down(0)
    return first


@case(
    ONE,
    "the SSH link to the host goes down mid-launch (the launch held on the host, then {finishing there while the link is down | still running when the retry starts}); Prefect retries the launch once the link is back",
    "the retry takes the host's launch lock and finds the same run id: it adopts the trainer the first try started (or starts it, and the first try then adopts it); exactly one trainer, one run folder, healthy",
)
@pytest.mark.parametrize("first_try", ["finishes while the link is down", "is still running when the retry starts"])
def test_a_connection_dropped_mid_launch_is_retried_without_ever_starting_a_second_trainer(host: Fleet, tmp_path: Path, first_try: str):
    target = target_on(host, tmp_path)
    try:
        with recovering(target) as report:
            held = drop_link_while_held(host, target, "launch-trainer-in-tmux", "the launch to start on the host")
            if first_try == "finishes while the link is down":
                release(held[2])
                wait_for(lambda: start_time(held[0]) is None, 60, "the first try's launch to finish on the host")
                wait_for(lambda: retrying(target, "launch"), 60, "Prefect to give the dropped launch up and schedule a retry")
                host.up(0)
            else:
                wait_for(lambda: retrying(target, "launch"), 60, "Prefect to give the dropped launch up and schedule a retry")
                host.up(0)
                wait_for(lambda: [r for r in records(target, "launch-trainer-in-tmux") if r[0] != held[0]], 60, "the retry's launch")
                release(held[2])
            result = report()
        assert result.verdict is Verdict.HEALTHY, result.timeline()
        assert len(live_trainers(target)) == 1 and len(live_supervisor_groups(target)) == 1, live_trainers(target)
        assert len(runs(target)) == 1, runs(target)
        if first_try == "finishes while the link is down":
            assert step_detail(result, "launch").adopted, "the retry adopted the first try's trainer"
    finally:
        host.up(0)
        reap(target)


@case(
    MID_STEP,
    "the SSH link to the host goes down while `uv pip sync` writes the fresh venv aside (`VENV.new-STAMP`, before the stop; held on the host, still running when Prefect retries build_venv)",
    "the retry first stops the first try's install by its recorded PID and group, keeps that half-built build aside as `.incomplete-STAMP` (never swapped in), builds `.new-STAMP` again; after the stop the swap keeps the user's venv intact as `.old-STAMP`: a complete venv, one trainer, healthy",
)
def test_a_connection_dropped_mid_rebuild_stops_the_first_install_and_leaves_a_usable_venv(host: Fleet, tmp_path: Path):
    target = target_on(host, tmp_path, import_check=["tinyjunk", "bigjunk"])
    # A wheel big enough that its install is seen running on the host.
    big_wheel(Path(target.find_links[0]), "bigjunk", "1.0.0", 64)
    Path(target.lock_path).write_text("tinyjunk==0.1.0\nbigjunk==1.0.0\n")
    venv = Path(target.venv_dir)
    subprocess.run(["uv", "venv", "-q", "--python", target.python, str(venv)], check=True)  # the user's venv
    (venv / "mine").write_text("the user's venv\n")
    try:
        with recovering(target) as report:
            # The install's label names the lock and the folder it builds: `uv pip sync LOCK into VENV.new-STAMP`.
            held = drop_link_while_held(host, target, "uv-pip-sync", "uv pip sync to start on the host")
            wait_for(lambda: retrying(target, "build_venv"), 60, "Prefect to give the dropped build up and schedule a retry")
            host.up(0)
            result = report()
        assert result.verdict is Verdict.HEALTHY, result.timeline()
        assert start_time(held[0]) is None, "the first try's install was stopped, not left writing beside the retry"
        old = sorted(venv.parent.glob(venv.name + ".old-*"))
        assert len(old) == 1 and (old[0] / "mine").read_text() == "the user's venv\n", old
        stamp = old[0].name.removeprefix(venv.name + ".old-")
        built, swapped = step_detail(result, "build_venv"), step_detail(result, "rebuild_venv")
        assert built.built == f"{venv}.new-{stamp}" and not built.reused, "the retry built again, in the same rebuild's folder"
        assert swapped.prepared and swapped.old_venv == str(old[0]), "the swap took build_venv's build and names the user's venv"
        # The half-built first try: kept aside under the same stamp, still marked half-built, never swapped in.
        incomplete = sorted(venv.parent.glob(venv.name + ".incomplete-*"))
        assert [p.name for p in incomplete] == [f"{venv.name}.incomplete-{stamp}"] and (incomplete[0] / BUILDING_MARKER).exists(), (
            incomplete
        )
        # In place: the retry's complete build of this stamp, with the lock installed.
        assert not (venv / BUILDING_MARKER).exists() and (venv / BUILT_RECORD).read_text().split("\n", 1)[0] == stamp
        assert not sorted(venv.parent.glob(venv.name + ".new-*")), "nothing left aside unswapped"
        subprocess.run([str(venv / "bin" / "python"), "-c", "import bigjunk, tinyjunk"], check=True)
        assert len(live_trainers(target)) == 1 and len(live_supervisor_groups(target)) == 1, live_trainers(target)
    finally:
        host.up(0)
        reap(target)


# A warm-up that takes a few seconds, so that it is seen (and held) on the host; it writes one kernel when done.
SLOW_WARMUP = 'echo compiling; sleep 2; echo warmed > "$TORCHINDUCTOR_CACHE_DIR/kernel.bin"'


@case(
    MID_STEP,
    "the SSH link to the host goes down while the warm-up compiles (held on the host, still running when Prefect retries warm_cache)",
    "the retry first stops the first try's warm-up by its recorded PID and group, clears and warms the cache again: the cache is the retry's alone, one trainer, healthy",
)
def test_a_connection_dropped_mid_warm_up_stops_the_first_warm_up_and_warms_again(host: Fleet, tmp_path: Path):
    target = target_on(host, tmp_path, warmup_command=SLOW_WARMUP)
    try:
        with recovering(target) as report:
            held = drop_link_while_held(host, target, "warm-up", "the warm-up to start on the host")
            wait_for(lambda: retrying(target, "warm_cache"), 60, "Prefect to give the dropped warm-up up and schedule a retry")
            host.up(0)
            result = report()
        assert result.verdict is Verdict.HEALTHY, result.timeline()
        assert start_time(held[0]) is None, "the first try's warm-up was stopped, not left writing beside the retry"
        cache = Path(target.inductor_cache_dir)
        assert (cache / "kernel.bin").read_text() == "warmed\n" and not (cache / ".relaunch-warming").exists()
        assert len(live_trainers(target)) == 1
    finally:
        host.up(0)
        reap(target)
