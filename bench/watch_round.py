"""What one round of `relaunch watch` costs over many SSH hosts, and what watching costs per target-hour.

    .venv/bin/python bench/watch_round.py [--sizes 64,128] [--rounds 5] [--interval-seconds 10]   # root

Every target is on a host of its own: a network namespace with its own address and sshd (relaunch/testing/netns.py
`fleet_of_hosts`), its trainer (relaunch/testing/targets.py's stepper, a step line every 5 s) launched there by
relaunch. One flows/watch.Watch over the first N targets looks at them `--rounds` times: the first round on new
connections (one handshake per host), the rest on the connections it keeps, as a long-running watch does.

Per size it prints the round's seconds (new connections, then the median and max of the reused rounds) and the
watch process's CPU seconds per round (threads included). What a target-hour of watching costs at
`--interval-seconds`: the worker's CPU seconds (a reused round's CPU / N x rounds per hour), and the host's
(one look run through a local shell --looks times, its child CPU per look x looks per hour; over SSH, sshd's own
share of a kept connection is left out). Uses PREFECT_API_URL when set, else a temporary local server (SQLite; the
watch reads each target's last handover there). Every trainer and host is gone at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The fleet bench's hosts, targets and launches; importing it also sets its environment (no telemetry, quiet logs,
# this interpreter's bin first on PATH) and puts the checkout on sys.path.
from fleet_checks import bench_work, launch_all, log, make_targets, ssh_hosts, stop_all  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,128", help="Numbers of hosts to watch, comma-separated.")
    parser.add_argument("--rounds", type=int, default=5, help="Rounds per size (the first on new connections).")
    parser.add_argument("--interval-seconds", type=float, default=10.0, help="The watch interval the per-hour costs assume.")
    parser.add_argument("--looks", type=int, default=50, help="Local looks timed for the host's CPU per look.")
    parser.add_argument("--max-workers", type=int, default=32, help="The watch's threads (looks in flight at once).")
    args = parser.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")})

    t0 = time.monotonic()
    with ExitStack() as stack:
        work = bench_work(stack)
        start = time.monotonic()
        hosts = ssh_hosts(stack, work, max(sizes))
        log(f"{len(hosts)} hosts in network namespaces, each with its sshd ({time.monotonic() - start:.1f} s)")
        targets = make_targets(work, max(sizes), 5.0, hosts)
        stack.callback(stop_all, targets)
        start = time.monotonic()
        launch_all(targets)
        log(f"{len(targets)} trainers running ({time.monotonic() - start:.1f} s)")
        results = [measure(targets[:n], args) for n in sizes]
        host = host_cost(work, args)
        load = round(os.getloadavg()[0], 2)
    print(
        json.dumps(
            {
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_1m": load},
                "interval_seconds": args.interval_seconds,
                "results": results,
                "host": host,
                "seconds": round(time.monotonic() - t0, 1),
            },
            indent=2,
        )
    )


def measure(targets: list, args: argparse.Namespace) -> dict:
    from relaunch.flows.watch import Watch
    from relaunch.wire.transport import close_all

    close_all()  # the first round makes one handshake per host
    lines: list[str] = []
    watch = Watch([], lines.append, max_workers=args.max_workers, targets=targets)
    rounds: list[dict[str, float]] = []
    for _ in range(args.rounds):
        wall, cpu = time.monotonic(), time.process_time()
        watch.round(wait_seconds=60)
        rounds.append({"seconds": time.monotonic() - wall, "cpu_seconds": time.process_time() - cpu})
    watch.finish()
    seen = Counter(w.last.value if w.last else "none" for w in watch.watched.values())
    reused = rounds[1:] or rounds
    cpu_round = statistics.median(r["cpu_seconds"] for r in reused)
    per_hour = 3600.0 / args.interval_seconds
    out = {
        "hosts": len(targets),
        "new_connections_round_seconds": round(rounds[0]["seconds"], 3),
        "reused_round_seconds_median": round(statistics.median(r["seconds"] for r in reused), 3),
        "reused_round_seconds_max": round(max(r["seconds"] for r in reused), 3),
        "worker_cpu_seconds_per_round": round(cpu_round, 3),
        "worker_cpu_seconds_per_target_hour": round(cpu_round / len(targets) * per_hour, 2),
        "seen": dict(seen),
    }
    log(f"  {len(targets)} hosts: {json.dumps(out)}")
    return out


def host_cost(work: Path, args: argparse.Namespace) -> dict:
    """One look's CPU on the host: the pulse run through a local shell, as sshd runs it, its children's CPU."""
    from relaunch.plans.watch import plan_pulse
    from relaunch.tasks.launch import launch
    from relaunch.testing.targets import shell_target, stop_all
    from relaunch.wire.transport import run, transport_for

    target = shell_target(work / "local", name="watch-cost", env={"STEP_SECONDS": "5"})
    launch.fn(target, 1)
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.monotonic()
        for _ in range(args.looks):
            run(transport_for(target.host), plan_pulse(target))
        wall = time.monotonic() - wall
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        stop_all(target)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / args.looks
    return {
        "looks": args.looks,
        "look_ms": round(1000 * wall / args.looks, 1),
        "host_cpu_ms_per_look": round(1000 * cpu, 2),
        "host_cpu_seconds_per_target_hour": round(cpu * 3600.0 / args.interval_seconds, 2),
    }


if __name__ == "__main__":
    main()
