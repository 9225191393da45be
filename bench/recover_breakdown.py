"""Time to recover, per demo scenario, broken down by phase: each scenario through the whole recover-training flow.

    python bench/recover_breakdown.py [--device cpu|cuda] [--scenario NAME ...] [--workdir DIR] [--logs DIR]

Each scenario is broken for real (relaunch.demo.scenarios.prepare) and recovered by `recover_training` under a
temporary Prefect server, as `relaunch demo` does. The phases come from the flow's own records:
- detection: the first health check (the task run `check_health`, its start to its end, from the Prefect API);
- stop (it waits until the GPUs list none of the stopped trainer's processes), venv (rebuild_venv or
  install_package), restore, warm-up (warm_cache), launch: the report's StepRecords, summed over attempts;
- first step: the relaunched trainer's own line `first step in X s, Y s after the process started` (Y);
- healthy verdict: the last health check, from just after the launch until it says healthy (it holds the first step);
- total: the flow run, end to end.
Prints one JSON document (bench/record.py keeps it) and a table on stderr; exits 1 unless every scenario ends
healthy with the first verdict the scenario expects. With --logs, each scenario's trainer logs (the broken run
and every attempt) are copied to DIR/SCENARIO/.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _flow_env import ROOT  # noqa: E402,F401 - first: the environment Prefect is imported into

from relaunch.config import Target  # noqa: E402
from relaunch.demo.scenarios import SCENARIOS, prepare, say  # noqa: E402
from relaunch.demo.target import resolve_device  # noqa: E402
from relaunch.flows.outcome import report_of  # noqa: E402
from relaunch.flows.recover import recover_training  # noqa: E402
from relaunch.records.report import Report  # noqa: E402
from relaunch.tasks.stop import stop  # noqa: E402
from relaunch.vocabulary import Step, Verdict  # noqa: E402

FIRST_STEP = re.compile(r"first step in [\d.]+ s, (?P<process>[\d.]+) s after the process started")
PHASES = {
    "stop": (Step.STOP,),
    "venv": (Step.REBUILD_VENV, Step.INSTALL_PACKAGE),
    "restore": (Step.RESTORE_CODE,),
    "warmup": (Step.WARM_CACHE,),
    "launch": (Step.LAUNCH,),
}


def health_checks(flow_run_id: object) -> list[float]:
    """Seconds of each check_health task run of the flow run, in the order they ran."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    checks = sorted((r for r in runs if r.name.startswith("check_health@") and r.start_time and r.end_time), key=lambda r: r.start_time)
    return [round((r.end_time - r.start_time).total_seconds(), 2) for r in checks]


def first_step_seconds(target: Target, report: Report) -> float | None:
    """Process start to first step line, as the last launched attempt's trainer printed it."""
    launched = [s for a in report.attempts for s in a.steps if s.step is Step.LAUNCH]
    if not launched:
        return None
    found = FIRST_STEP.search(Path(launched[-1].detail.log_path).read_text(errors="replace"))
    return float(found["process"]) if found else None


def breakdown(scenario: str, target: Target, report: Report, checks: list[float], total: float) -> dict[str, object]:
    steps = [s for a in report.attempts for s in a.steps]
    row: dict[str, object] = {
        "scenario": scenario,
        "attempts": [
            {"verdict": a.verdict.value, "cause": a.cause.value if a.cause else None, "action": a.action.value, "summary": a.summary}
            for a in report.attempts
        ],
        "ends": report.verdict.value if report.verdict else None,
        "detection_seconds": checks[0] if checks else None,
    }
    for phase, kinds in PHASES.items():
        row[f"{phase}_seconds"] = round(sum(s.seconds for s in steps if s.step in kinds), 2)
    row["first_step_seconds"] = first_step_seconds(target, report)
    row["healthy_verdict_seconds"] = checks[-1] if len(checks) > 1 else None
    row["health_checks_seconds"] = checks
    row["total_seconds"] = round(total, 2)
    expected = SCENARIOS[scenario]
    first = report.attempts[0]
    row["as_expected"] = (
        (first.verdict, first.cause) == (expected.expected_verdict, expected.expected_cause)
        and report.ok
        and report.verdict is Verdict.HEALTHY
    )
    return row


def keep_logs(target: Target, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for log in sorted(Path(target.log_dir).glob("*.log")):
        shutil.copy(log, dest / log.name)


def one(scenario: str, device: str, workdir: Path, logs: Path | None) -> dict[str, object]:
    target = prepare(scenario, workdir / scenario, device=device)
    try:
        start = time.monotonic()
        state = recover_training(target, return_state=True)
        total = time.monotonic() - start
        report = report_of(state)
        row = breakdown(scenario, target, report, health_checks(state.state_details.flow_run_id), total)
        (workdir / scenario / "report.json").write_text(report.model_dump_json(indent=2))
        say(f"{scenario}: " + " | ".join(report.timeline()))
    finally:
        stop.fn(target)
        if logs:
            keep_logs(target, logs / scenario)
    return row


def table(rows: list[dict[str, object]]) -> str:
    cols = ["detection", "stop", "venv", "warmup", "launch", "first_step", "healthy_verdict", "total"]
    lines = ["scenario            " + "".join(f"{c:>16}" for c in cols) + "  attempts"]
    for r in rows:
        cells = "".join(f"{'-' if r.get(f'{c}_seconds') is None else format(r[f'{c}_seconds'], '.1f'):>16}" for c in cols)
        lines.append(f"{r['scenario']:<20}{cells}  " + " -> ".join(a["verdict"] for a in r["attempts"]))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda where torch sees a GPU")
    p.add_argument("--scenario", action="append", choices=list(SCENARIOS), help="default: all, in the demo's order")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "relaunch-recover-breakdown")
    p.add_argument("--logs", type=Path, help="copy each scenario's trainer logs to LOGS/SCENARIO/")
    a = p.parse_args()
    device = resolve_device(a.device)
    from prefect.testing.utilities import prefect_test_harness

    rows = []
    with prefect_test_harness(server_startup_timeout=120):
        for scenario in a.scenario or list(SCENARIOS):
            try:
                rows.append(one(scenario, device, a.workdir, a.logs))
            except Exception as exc:  # noqa: BLE001 - the other scenarios still run; the failure is a row and the exit code
                rows.append({"scenario": scenario, "error": f"{type(exc).__name__}: {exc}", "attempts": [], "as_expected": False})
                say(f"{scenario}: {type(exc).__name__}: {exc}")
    from bench.warmup_efficacy import environment

    print(json.dumps({"environment": environment(device), "scenarios": rows}, indent=2))
    print(table([r for r in rows if "error" not in r]), file=sys.stderr)
    return 0 if all(r["as_expected"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
