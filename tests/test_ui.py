"""The Prefect UI of a real server, in a real (headless Chromium) browser, after a real recovery.

bench/ui_check.py does the work (it also writes docs/ui/*.png): `prefect server start` with the UI on, a bash
trainer that crashed, `relaunch recover` as typed against that server, then Chromium renders the flow run's
pages. Here the screenshots go to tmp_path; what a person would see on each page is asserted from the DOM.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path

from relaunch.testing.sshd import cannot_run_here

ROOT = Path(__file__).resolve().parent.parent


def _ui_check():
    spec = importlib.util.spec_from_file_location("ui_check", ROOT / "bench" / "ui_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_the_flow_run_page_shows_step_at_host_task_runs_and_the_report_artifact_shows_the_verdict(tmp_path):
    ui = _ui_check()
    if ui.find_chromium() is None:
        cannot_run_here("no chromium on PATH; install it: apt-get update && apt-get install -y chromium")
    shots = tmp_path / "shots"
    result = ui.ui_check(shots, tmp_path / "work")
    pages = result["pages"]
    assert result["verdict"] == "healthy" and result["flow_run"]["state"] == "Recovered", result["flow_run"]
    task_runs = pages["flow-run-task-runs"]
    assert "launch@localhost" in result["flow_run"]["task_runs"]
    assert (
        "recover-nightly" in task_runs["text"] and "launch@localhost" in task_runs["text"] and "check_health@localhost" in task_runs["text"]
    ), task_runs["text"][:3000]
    artifacts = pages["flow-run-artifacts"]
    assert "recover-training-nightly" in artifacts["text"] and "healthy:" in artifacts["text"], artifacts["text"][:3000]
    report = pages["report-artifact"]
    assert "Verdict: healthy" in report["text"] and "Attempt 1: crashed" in report["text"], report["text"][:3000]
    assert (result["escalated_run"]["state"], result["escalated_run"]["state_type"]) == ("Escalated", "FAILED"), result["escalated_run"]
    assert "runs-list" in pages and "flow-run-escalated" in pages and "flow-run-recovered" in pages, sorted(pages)
    assert not any(page["missing"] for page in pages.values()), {name: page["missing"] for name, page in pages.items()}
    for name in pages:
        assert png_size(shots / f"{name}.png") == (1440, 1000)
