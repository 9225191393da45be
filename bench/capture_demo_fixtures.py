"""Re-capture tests/fixtures/logs/demo/ from real runs of the demo trainer (CPU, torch.compile).

Usage: .venv/bin/python bench/capture_demo_fixtures.py [WORKDIR]   (about 3 minutes)
Each fixture is the attempt-0 log of the broken run, copied as it was written.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from relaunch.demo.scenarios import prepare  # noqa: E402
from relaunch.plans.stop import plan_stop  # noqa: E402
from relaunch.tasks.launch import launch  # noqa: E402
from relaunch.tasks.rebuild_venv import rebuild_venv  # noqa: E402
from relaunch.wire.transport import run, transport_for  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "logs" / "demo"


def attempt_log(target, prefix: str = "") -> Path:
    return sorted(Path(target.log_dir).glob(f"*{prefix}.log"))[-1]


def wait_for(path: Path, text: str, count: int = 1, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count(text) >= count:
            return
        time.sleep(0.5)
    raise SystemExit(f"{path} never showed {text!r} x{count}")


def main(work: Path) -> None:
    rows = []
    for scenario, name in [
        ("missing-dependency", "missing_dependency"),
        ("fx-race", "fx_race_cpu"),
        ("silent-death", "silent_death"),
        ("degraded", "degraded_uncompiled"),
    ]:
        target = prepare(scenario, work / scenario)
        log = attempt_log(target, "-a0")
        if scenario == "degraded":
            wait_for(log, "step=", 8)
        run(transport_for(target.host), plan_stop(target, 20), check=False)
        if scenario == "fx-race" and "dynamo-optimized" not in log.read_text():
            name = "fx_race_cpu_module_call"  # the race's other face: FX's patched Module.__call__
        shutil.copy(log, OUT / f"{name}.log")
        rows.append((f"{name}.log", f"`relaunch demo` scenario {scenario}: the broken run (attempt 0), before recovery"))
    target = prepare("healthy", work / "hang")
    rebuild_venv.fn(target)
    hang = target.model_copy(update={"env": {**target.env, "DEMO_FAULT": "hang"}})
    launch.fn(hang, 0)
    log = attempt_log(hang, "-a0")
    wait_for(log, "waiting for the next batch")
    time.sleep(3)  # let the quiet show in the log's age; nothing is printed while hung
    run(transport_for(hang.host), plan_stop(hang, 20), check=False)
    shutil.copy(log, OUT / "hang.log")
    rows.append(("hang.log", "demo trainer with DEMO_FAULT=hang: drafters block after 5 steps; stopped by relaunch (SIGTERM)"))
    torch = subprocess.run(
        [f"{target.venv_dir}/bin/python", "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    table = "\n".join(f"| {f} | {what} | {stamp} |" for f, what in rows)
    (OUT / "PROVENANCE.md").write_text(
        "# Demo trainer fixtures\n\nCaptured by `bench/capture_demo_fixtures.py` on a 2-core CPU machine, "
        f"torch {torch}, Python {sys.version.split()[0]}. Each file is the trainer's log exactly as the supervisor wrote it; "
        "lines starting `[relaunch]` are the supervisor's own.\n\n| file | what produced it | captured |\n| --- | --- | --- |\n"
        + table
        + "\n"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/relaunch-fixtures"))
