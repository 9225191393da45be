"""`relaunch check TARGET` wall time from a plain shell, on a healthy demo target, with and without a Prefect server.

The target is the demo's (demo/scenarios.py prepare, scenario healthy), launched and left stepping; each run is
`relaunch check TARGET` as a subprocess with a plain environment (PATH=VENV_BIN:/usr/bin:/bin and HOME), timed
from process start to exit, and must print `verdict: healthy` and exit 0. Two modes, alternated run by run:

- `server`: PREFECT_API_URL set to a `prefect server start` this bench runs (its own PREFECT_HOME);
- `temporary`: no server configured: relaunch starts its temporary server (Prefect's ephemeral default);
- `agent`: as `server`, through a `relaunch agent start`ed once before the runs (relaunch/cli/agent.py). Its CPU
  column counts the client only: the command runs in the agent's child, not a child of this bench.

    .venv/bin/python bench/record.py check_time -- .venv/bin/python bench/check_time.py [--runs 20]

Median and p95 (nearest rank; the maximum for fewer than 20 runs) from bench/stats.py. The demo trainer keeps
one CPU core busy meanwhile, as a training run would keep its host busy.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for `bench.`

# bench.overhead also puts the venv's bin first on PATH and sets DO_NOT_TRACK, as this bench needs.
from bench.overhead import VENV_BIN, agent_runtime, prefect_server, relaunch_agent, wait_for  # noqa: E402
from bench.stats import P95_METHOD, machine, summary  # noqa: E402

SESSION = "relaunch-bench-check-time"
MODES = ("server", "temporary", "agent")
GOAL_SECONDS = 2.0


def log(message: str) -> None:
    print(f"[check_time] {message}", file=sys.stderr, flush=True)


def plain_env(api_url: str | None, agent: bool = False) -> dict[str, str]:
    env = {"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    # The bench's own agent folder; every mode but `agent` in-process, whatever agent a user runs.
    env["XDG_RUNTIME_DIR"], env["RELAUNCH_AGENT"] = str(agent_runtime()), "on" if agent else "off"
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def one_check(target_file: Path, api_url: str | None, baseline: Path | None = None, agent: bool = False) -> tuple[float, float]:
    """Wall seconds, and CPU seconds of the CLI and everything it started and reaped (its temporary server too)."""
    argv, env, cwd = [str(VENV_BIN / "relaunch"), "check", str(target_file)], plain_env(api_url, agent), None
    if baseline:
        # An older relaunch tree ahead of this checkout; `python -m` puts the working directory first on sys.path.
        argv[0:1] = [sys.executable, "-m", "relaunch.cli"]
        env["PYTHONPATH"], cwd = str(baseline), baseline
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=cwd)
    seconds, after = time.monotonic() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    # Under heavy load the demo trainer can dip below its degraded threshold: the check does the same work either way.
    if (proc.returncode, proc.stdout.count("verdict: healthy") + proc.stdout.count("verdict: degraded")) not in ((0, 1), (1, 1)):
        raise SystemExit(f"check_time: relaunch check exited {proc.returncode}:\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="Runs per mode.")
    parser.add_argument("--workdir", type=Path, help="Keep the target and the server's log here (default: a temp folder, removed).")
    parser.add_argument(
        "--baseline", type=Path, help="An older relaunch tree to time as well (modes `server-baseline`, `temporary-baseline`)."
    )
    args = parser.parse_args()
    # Started in the background (SIGINT ignored) or stopped by a harness: SIGTERM still runs the clean-up below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from relaunch.cli.tempserver import DEFAULT_LOCAL_API_URL, reachable
    from relaunch.demo.scenarios import prepare
    from relaunch.tasks.launch import launch
    from relaunch.tasks.stop import stop

    if reachable(DEFAULT_LOCAL_API_URL):
        raise SystemExit(f"a Prefect server answers at {DEFAULT_LOCAL_API_URL}: the temporary mode would use it; stop it first")
    tmp = args.workdir or Path(tempfile.mkdtemp(prefix="relaunch-bench-check-time-"))
    tmp.mkdir(parents=True, exist_ok=True)
    before = machine()
    target = None
    modes = MODES + (tuple(f"{m}-baseline" for m in MODES) if args.baseline else ())
    samples: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    try:
        target = prepare("healthy", tmp / "target", name=SESSION)
        import yaml

        target_file = tmp / "target.yaml"
        target_file.write_text(yaml.safe_dump(target.model_dump(mode="json", exclude_defaults=True), sort_keys=False))
        launch.fn(target, 1)
        steps = target.thresholds.healthy_steps + 2
        wait_for(target, f"{steps} step lines", lambda s: sum(line.startswith("step=") for line in s.log_tail) >= steps)
        log("the demo trainer is stepping")
        with prefect_server(tmp / "prefect-home") as api_url, relaunch_agent():
            for number in range(args.runs):
                for mode in modes if number % 2 == 0 else modes[::-1]:
                    baseline = args.baseline if mode.endswith("-baseline") else None
                    server = None if mode.startswith("temporary") else api_url
                    seconds, used = one_check(target_file, server, baseline, agent=mode == "agent")
                    samples[mode].append(round(seconds, 3))
                    cpu[mode].append(round(used, 3))
                    log(f"run {number + 1}/{args.runs} {mode:<18} {seconds:5.2f} s, {used:5.2f} s CPU (load {os.getloadavg()[0]:.2f})")
    finally:
        if target is not None:
            stop.fn(target)
        if args.workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    result: dict[str, Any] = {
        "what": "wall seconds of `relaunch check TARGET` from a plain shell on a healthy demo target, with a running `prefect server start` (PREFECT_API_URL), without (relaunch's temporary server), and with that server through a running `relaunch agent`",
        "p95_method": P95_METHOD,
        "goal_seconds_with_server": GOAL_SECONDS,
        "machine_before": before,
        "machine_after": machine(),
        "baseline": str(args.baseline) if args.baseline else None,
        **{mode: summary(samples[mode], unit="seconds") for mode in modes},
        # CPU of the CLI and its children (the temporary server too): on a shared 2-core host, less sensitive to load than wall time.
        "cpu": {mode: summary(cpu[mode], unit="seconds") for mode in modes},
        "samples": samples,
        "cpu_samples": cpu,
    }
    for mode in modes:
        s = result[mode]
        c = result["cpu"][mode]
        log(
            f"{mode:<18} median {s['median_seconds']:.2f} s, p95 {s['p95_seconds']:.2f} s; CPU median {c['median_seconds']:.2f} s (n={s['n']})"
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
