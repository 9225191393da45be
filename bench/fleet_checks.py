"""How many targets one worker checks per minute: N real trainers in tmux, all healthy, one `check_fleet(recover=False)`.

    .venv/bin/python bench/fleet_checks.py [--sizes 10,25,50] [--max-concurrent 4] [--step-seconds 1]
    .venv/bin/python bench/fleet_checks.py --ssh [--sizes 8,16,32,64] [--max-concurrent 16]   # root: network namespaces

Starts max(sizes) bash trainers (relaunch/testing/targets.py's stepper, one tmux session each, one shared repo), waits
until the youngest has its healthy step lines, then runs check-fleet once per size on the first N targets
and prints JSON. Uses PREFECT_API_URL when set, else a temporary local server (SQLite). Every trainer it
started is stopped at the end, by its records. Takes about a minute on a 2-core machine.

With --ssh every target is on a host of its own: a network namespace with its own address and sshd
(relaunch/testing/netns.py `fleet_of_hosts`), reached over SSH. Each size is checked twice: `new`, right after every
connection was closed (one handshake per host inside the check), then `reused`, on the connections the
first round left open, as the checks of a long-lived worker are.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", help="Fleet sizes to time, comma-separated (default 10,25,50; with --ssh 8,16,32,64).")
    parser.add_argument(
        "--max-concurrent", help="check_fleet's max_concurrent; several comma-separated values time each (default 4; with --ssh 16)."
    )
    parser.add_argument("--step-seconds", type=float, default=1.0, help="Seconds between the fake trainers' step lines.")
    parser.add_argument("--ssh", action="store_true", help="One host per target: network namespaces with an sshd each (root).")
    args = parser.parse_args()
    sizes = sorted({int(s) for s in (args.sizes or ("8,16,32,64" if args.ssh else "10,25,50")).split(",")})
    concurrencies = [int(c) for c in (args.max_concurrent or ("16" if args.ssh else "4")).split(",")]

    t0 = time.monotonic()
    with ExitStack() as stack:
        work = bench_work(stack)
        log(f"server up ({time.monotonic() - t0:.1f} s)")
        hosts_seconds = None
        if args.ssh:
            start = time.monotonic()
            hosts = ssh_hosts(stack, work, max(sizes))
            hosts_seconds = round(time.monotonic() - start, 1)
            log(f"{len(hosts)} hosts in network namespaces, each with its sshd ({hosts_seconds} s)")
        else:
            hosts = None
        targets = make_targets(work, max(sizes), args.step_seconds, hosts)
        stack.callback(stop_all, targets)
        start = time.monotonic()
        launch_all(targets)
        setup_seconds = round(time.monotonic() - start, 1)
        log(f"{len(targets)} trainers running ({setup_seconds} s)")
        measure(targets[:2], concurrencies[0])  # warm-up: the first flow run of a process pays for imports and client set-up
        rounds = ("new", "reused") if args.ssh else (None,)
        results = [measure(targets[:n], c, connections) for c in concurrencies for n in sizes for connections in rounds]
        load = round(os.getloadavg()[0], 2)
    print(
        json.dumps(
            {
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_1m": load},
                "hosts": "ssh, one network namespace and sshd per target" if args.ssh else "local",
                "hosts_seconds": hosts_seconds,
                "launch_seconds": setup_seconds,
                "step_seconds": args.step_seconds,
                "results": results,
            },
            indent=2,
        )
    )


def bench_work(stack: ExitStack) -> Path:
    """A work folder for the bench, removed when the stack closes; and a temporary Prefect server (SQLite) unless
    PREFECT_API_URL names one."""
    if not os.environ.get("PREFECT_API_URL"):
        from prefect.testing.utilities import prefect_test_harness

        os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="relaunch-bench-prefect-"))
        stack.enter_context(prefect_test_harness(server_startup_timeout=120))
    return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="relaunch-bench-")))


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def ssh_hosts(stack: ExitStack, work: Path, n: int) -> list:
    """n hosts, each in its own network namespace with its own sshd; all removed when the stack closes."""
    from relaunch.testing.netns import fleet_of_hosts

    fleet = stack.enter_context(fleet_of_hosts(n, work / "hosts"))
    # The checks' own limits, as a fleet deployment would set them; 10 s covers a handshake on a loaded 2-core box.
    return [server.ssh_host(connect_timeout_seconds=10.0, command_timeout_seconds=60.0) for server in fleet.servers]


def make_targets(work: Path, n: int, step_seconds: float, hosts: list | None = None):
    from relaunch.testing.targets import shell_target

    base = shell_target(work / "shared", name="bench")  # one lock and venv; each target its own repo, logs, state folder and session
    for i in range(n):
        # Its own checkout: a launch refuses beside a process running the same program in the same repo_dir (a trainer
        # started by hand), and network namespaces share one process table.
        shutil.copytree(base.repo_dir, work / f"t{i:03d}" / "repo", symlinks=True)
    return [
        base.model_copy(
            update={
                "name": f"bench{i:03d}",
                "tmux_session": f"{base.tmux_session}-{i:03d}",
                "repo_dir": str(work / f"t{i:03d}" / "repo"),
                "log_dir": str(work / f"t{i:03d}" / "logs"),
                "state_dir": str(work / f"t{i:03d}" / "state"),  # a state folder is one target's (launch refuses a shared one)
                "env": {"STEP_SECONDS": str(step_seconds)},
                **({"host": hosts[i]} if hosts else {}),
            }
        )
        for i in range(n)
    ]


def launch_all(targets) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from relaunch.tasks.health import collect_snapshot
    from relaunch.tasks.launch import launch

    with ThreadPoolExecutor(max_workers=8) as pool:  # over SSH each launch is a few round trips on its own host
        list(pool.map(lambda t: launch.fn(t, 1), targets))
    youngest, needed = targets[-1], targets[-1].thresholds.healthy_steps
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # long-polls the host; no fixed sleep
        snap = collect_snapshot(youngest, wait_seconds=1)
        if sum("step=" in line for line in snap.log_tail) > needed:
            return
    raise SystemExit("the trainers never reached their healthy step count")


def measure(targets, max_concurrent: int, connections: str | None = None) -> dict:
    from relaunch.flows.fleet import check_fleet
    from relaunch.vocabulary import Verdict
    from relaunch.wire.transport import close_all

    if connections == "new":
        close_all()
    log(f"checking {len(targets)} targets, max_concurrent={max_concurrent}" + (f", {connections} connections" if connections else ""))
    start = time.monotonic()
    fleet = check_fleet(targets, recover=False, max_concurrent=max_concurrent)
    seconds = time.monotonic() - start
    verdicts = {v.value: sum(r.verdict is v for r in fleet.rows) for v in Verdict if any(r.verdict is v for r in fleet.rows)}
    polls = [r.polls for r in fleet.rows]
    log(f"  {seconds:.2f} s wall, check phase {fleet.check_phase_seconds:.2f} s: {fleet.summary()}")
    return {
        "targets": len(targets),
        "max_concurrent": max_concurrent,
        **({"connections": connections} if connections else {}),
        "seconds": round(seconds, 2),
        "check_phase_seconds": fleet.check_phase_seconds,
        "checks_per_minute": round(60 * len(targets) / seconds, 1),
        "checks_per_minute_check_phase": fleet.checks_per_minute,
        "round_trips_per_check": round(statistics.mean(polls), 2),
        "max_round_trips": max(polls),
        "check_seconds_median": round(statistics.median(r.check_seconds for r in fleet.rows), 3),
        "verdicts": verdicts,
    }


def stop_all(targets) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from relaunch.plans.stop import plan_stop
    from relaunch.wire.transport import run, transport_for

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda t: run(transport_for(t.host), plan_stop(t, 10), check=False), targets))


if __name__ == "__main__":
    main()
