"""decide(): the one place where the playbook, the nights, the GPU ledger and the gang meet, in one order."""

from __future__ import annotations

import ast
from datetime import UTC, datetime
from pathlib import Path

from relaunch.deciding.decide import decide
from relaunch.deciding.history import night_of, restart_storm
from relaunch.deciding.ledger import Ledger
from relaunch.judging.findings import Diagnosis, Metrics
from relaunch.testing.targets import shell_target
from relaunch.vocabulary import Action, Cause, Verdict
from tests.test_nights import snapshot_of

NOW = datetime(2026, 12, 3, 3, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parent.parent


def test_a_gpu_fault_ledgers_the_failed_gpu_once_and_relaunches_on_the_spare_keeping_the_world_size(tmp_path):
    target = shell_target(tmp_path, env={"CUDA_VISIBLE_DEVICES": "0"}, spare_gpus=[1])
    snap = snapshot_of("xid79_journal.txt")
    fault = Diagnosis(verdict=Verdict.CRASHED, cause=Cause.GPU_FAULT)
    first = decide(
        target, fault, snap, [], [], attempts_left=3, force=False, storm=None, ledger=Ledger(host="h"), faults=[], running=target, at=NOW
    )
    assert first.action is Action.RELAUNCH and first.visible_gpus == [1], first.why
    assert [g.bus_id for g in first.ledger.gpus] == ["00000000:00:06.0"] and len(first.faults) == 1
    # The same fault read again on the next attempt is the same GPU: counted in the ledger, listed once.
    again = decide(
        target,
        fault,
        snap,
        [],
        [],
        attempts_left=2,
        force=False,
        storm=None,
        ledger=first.ledger,
        faults=first.faults,
        running=target,
        at=NOW,
    )
    assert len(again.faults) == 1 and again.ledger.gpus[0].times == 2


def test_a_storm_of_the_last_nights_escalates_what_the_playbook_would_relaunch(tmp_path):
    target = shell_target(tmp_path)
    crashed = Diagnosis(verdict=Verdict.CRASHED, cause=Cause.ERROR, metrics=Metrics(last_step=150))
    nights = [night_of(crashed, "/ckpt/step_100.pt", NOW.replace(day=d)) for d in (1, 2)]
    storm = restart_storm(nights, night_of(crashed, "/ckpt/step_100.pt", NOW), 72, 2)
    assert storm is not None

    def decided(storm_given):
        return decide(
            target, crashed, snapshot_of("xid79_journal.txt", gpu_health=[]), [], [],
            attempts_left=3, force=False, storm=storm_given, ledger=Ledger(host="h"), faults=[], running=target, at=NOW,
        )  # fmt: skip

    assert decided(None).action is not Action.ESCALATE
    assert decided(storm).action is Action.ESCALATE


def test_the_recovery_flow_decides_through_decide_alone():
    # A rule called from the flow beside decide() would be a second place that decides, in an order no test reads.
    tree = ast.parse((ROOT / "flows" / "recover.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    rules = {"choose_action", "across_nights", "gang_action", "place", "gpu_faults", "remedy"}
    assert "decide" in imported and not imported & rules, imported & rules
