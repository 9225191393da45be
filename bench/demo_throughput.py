"""The demo trainer's throughput, uncompiled and compiled, read from its own step lines.

Runs the `degraded` demo scenario as `relaunch demo --scenario degraded` does: `relaunch.demo.scenarios.prepare` builds
the target and launches the broken run (model.py hacked to skip torch.compile), then the recover-training flow,
on a temporary Prefect server as the CLI starts one, restores the code, re-warms the inductor cache and
relaunches the compiled trainer. The broken run is left stepping for --uncompiled-seconds before the flow
starts, and the recovered one for --compiled-seconds after the flow ends; then it is stopped and both runs'
logs (one per launch, found through the run records) are read with relaunch's own step and throughput
patterns.

A reading is the trainer's printed `(N.NKtok/s)`: drafters x batch x seq tokens over the mean of its last (up
to) 10 step intervals. Step 1's reading includes compilation or cache loading and is left out; every later
window excludes step 1. Summaries come from bench/stats.py (nearest-rank p95; p5 likewise), next to the
flow's own figure (the median of the last three readings it saw) for each attempt.

The tmux session is `relaunch-bench-degraded`, not the demo's `relaunch-demo-degraded`, so that this never
touches a demo or a test run going on at the same time; the work folder is a new temp folder, removed after.
Takes about 2.5 minutes on a 2-core machine.

Usage: .venv/bin/python bench/demo_throughput.py [--uncompiled-seconds 40] [--compiled-seconds 15] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from bench.stats import P95_METHOD, machine, nearest_rank, summary  # noqa: E402

SESSION = "relaunch-bench-degraded"


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def readings(log_path: Path, thresholds) -> list[tuple[int, float]]:
    """(step, tokens/s) of every step line that carries a throughput, parsed as the health check parses it."""
    from relaunch.judging.logtext import clean_lines
    from relaunch.judging.reading import read_log

    out = []
    for line in clean_lines(log_path.read_bytes().decode(errors="replace")):
        r = read_log([line], thresholds)
        if r.steps and r.throughputs:
            out.append((r.steps[0], r.throughputs[0]))
    return out


def runs(state: Path) -> list[dict]:
    """Every launch on record, oldest first: run id, start time, log path."""
    found = []
    for run in (state / "runs").iterdir():
        if (run / "log_path").exists() and (run / "started_at").exists():
            found.append(
                {
                    "run_id": run.name,
                    "started_at": float((run / "started_at").read_text()),
                    "log": Path((run / "log_path").read_text().strip()),
                }
            )
    return sorted(found, key=lambda r: r["started_at"])


def describe(values: list[tuple[int, float]]) -> dict:
    steady = [tps / 1000 for step, tps in values if step >= 2]
    if not steady:
        return {"n": 0, "readings": []}
    return {
        **summary(steady, unit="ktok_s", digits=2),
        "p5_ktok_s": round(nearest_rank(steady, 5), 2),
        "steps": [min(s for s, _ in values), max(s for s, _ in values)],
        "readings_ktok_s": [round(x, 2) for x in steady],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uncompiled-seconds", type=float, default=40.0, help="How long the broken run steps before the flow starts.")
    parser.add_argument("--compiled-seconds", type=float, default=15.0, help="How long the recovered run steps after the flow ends.")
    parser.add_argument("--keep", action="store_true", help="Keep the work folder (logs, venv, checkpoints).")
    args = parser.parse_args()

    # As `relaunch` does in main(): its own temporary Prefect server, started before Prefect is imported.
    from relaunch.cli.tempserver import start_for_cli

    start_for_cli(["demo"])

    import relaunch.demo.scenarios as scenarios
    from relaunch.demo.target import make_target
    from relaunch.flows.outcome import report_of
    from relaunch.flows.recover import recover_training
    from relaunch.tasks.stop import stop

    # The demo names its session after the scenario; the same name in a benchmark could stop a demo or a test's trainer.
    scenarios.make_target = lambda work, name, wheels, base: make_target(work, SESSION, wheels, base)

    before = machine()
    tmp = Path(tempfile.mkdtemp(prefix="relaunch-bench-demo-"))
    work = tmp / "degraded"  # must not exist yet: prepare() would stop a trainer by the demo's name first
    target = None
    try:
        t0 = time.monotonic()
        target = scenarios.prepare("degraded", work)
        log(f"broken (uncompiled) run launched after {time.monotonic() - t0:.0f} s; letting it step {args.uncompiled_seconds:.0f} s")
        time.sleep(args.uncompiled_seconds)
        t1 = time.monotonic()
        with contextlib.redirect_stdout(sys.stderr):
            report = report_of(recover_training(target=target, return_state=True))
        flow_seconds = time.monotonic() - t1
        log(
            f"recover-training ended {report.verdict} after {flow_seconds:.0f} s; letting the compiled run step {args.compiled_seconds:.0f} s"
        )
        time.sleep(args.compiled_seconds)
    finally:
        if target is not None:
            stop.fn(target)
    try:
        launches = runs(Path(target.state_path))
        uncompiled, compiled = launches[0], launches[-1]
        first, last = report.attempts[0], report.attempts[-1]
        result = {
            "what": "the demo trainer's printed throughput (Ktok/s, 10-step running mean, step 1 left out), uncompiled (the degraded scenario's broken run) and compiled (the run relaunch recovered)",
            "machine_before": before,
            "machine_after": machine(),
            "p95_method": P95_METHOD,
            "uncompiled_seconds": args.uncompiled_seconds,
            "compiled_seconds": args.compiled_seconds,
            "flow_seconds": round(flow_seconds, 1),
            "flow": {
                "ok": report.ok,
                "verdict": report.verdict.value if report.verdict else None,
                "attempts": [
                    {
                        "verdict": a.verdict.value,
                        "action": a.action.value,
                        "tokens_per_second": a.metrics.tokens_per_second,
                        "summary": a.summary,
                    }
                    for a in report.attempts
                ],
                "steps": [{"step": s.step, "seconds": s.seconds} for a in report.attempts for s in a.steps],
            },
            "first_attempt_tokens_per_second": first.metrics.tokens_per_second,
            "final_tokens_per_second": last.metrics.tokens_per_second,
            "uncompiled": {"run_id": uncompiled["run_id"], **describe(readings(uncompiled["log"], target.thresholds))},
            "compiled": {"run_id": compiled["run_id"], **describe(readings(compiled["log"], target.thresholds))},
            "launches": len(launches),
        }
        if not (report.ok and first.verdict.value == "degraded" and len(launches) >= 2):
            result["warning"] = "the scenario did not go degraded -> healthy: these are not the two runs the README compares"
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
