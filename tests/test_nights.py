"""Across nights, judged purely (relaunch/deciding/history.py, relaunch/deciding/ledger.py, relaunch/deciding/incidents.py): restart storms, the GPU
ledger and where a relaunch may run, incidents across the fleet. Kernel and nvidia-smi text: the captured fixtures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relaunch.deciding.history import History, Night, across_nights, night_of, restart_storm
from relaunch.deciding.incidents import Sick, cut_off, incidents
from relaunch.deciding.ledger import Ledger, gpu_faults, place, target_gpus
from relaunch.judging.findings import Diagnosis, Metrics
from relaunch.judging.hardware import parse_gpu_health
from relaunch.judging.logtext import clean_lines
from relaunch.judging.snapshot import HealthSnapshot
from relaunch.vocabulary import Action, Cause, Verdict

FIXTURES = Path(__file__).parent / "fixtures"
XID = FIXTURES / "logs" / "xid"
# Two H200s as nvidia-smi listed them: GPU 0 at 00:06 (the bus the Xid fixtures name), GPU 1 at 00:07.
TWO_GPUS = parse_gpu_health((FIXTURES / "gpu_host/nvidia_smi_query_ecc.csv").read_text())
NOW = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


def night(days_ago: float, cause: Cause | None = Cause.ERROR, checkpoint: str | None = "step_100.pt", verdict=Verdict.CRASHED) -> Night:
    crashed = Diagnosis(verdict=verdict, cause=cause, metrics=Metrics(last_step=150))
    return night_of(crashed, f"/ckpt/{checkpoint}" if checkpoint else None, NOW - timedelta(days=days_ago))


def storm(earlier: list[Night], now: Night, window_hours: float = 72, max_returns: int = 3):
    return restart_storm(earlier, now, window_hours, max_returns)


# ---- restart storms -----------------------------------------------------------------------------------------


def test_the_same_cause_returning_a_third_night_from_the_same_checkpoint_is_a_restart_storm_naming_each_night():
    found = storm([night(2), night(1)], night(0))
    assert found is not None and len(found.nights) == 3
    why = found.why()
    assert why.startswith("restart storm: crashed/error returned 3 times within 72 h, each time from checkpoint step_100.pt")
    assert "2026-11-30 03:00 UTC: crashed/error from checkpoint step_100.pt, log reached step 150" in why


def test_two_returns_are_not_yet_a_storm():
    assert storm([night(1)], night(0)) is None


def test_a_checkpoint_that_advanced_between_the_nights_ends_the_streak():
    assert storm([night(2), night(1, checkpoint="step_100.pt")], night(0, checkpoint="step_300.pt")) is None
    assert storm([night(3, checkpoint="step_50.pt"), night(2), night(1)], night(0)) is not None, (
        "progress before the streak does not end it"
    )


def test_checkpoints_without_a_step_in_their_name_advance_when_the_name_changes():
    assert storm([night(2, checkpoint="latest"), night(1, checkpoint="latest")], night(0, checkpoint="latest")) is not None
    assert storm([night(2, checkpoint="a"), night(1, checkpoint="a")], night(0, checkpoint="b")) is None


def test_nights_outside_the_window_do_not_count():
    assert storm([night(4), night(1)], night(0)) is None
    assert storm([night(4), night(1)], night(0), window_hours=24 * 5) is not None


@pytest.mark.parametrize("cause", [Cause.KILLED, Cause.SILENT_EXIT, Cause.GPU_FAULT, Cause.DISK_FULL])
def test_infrastructure_causes_neither_use_up_the_budget_nor_end_a_streak(cause):
    assert storm([night(2, cause), night(1, cause)], night(0, cause)) is None, f"{cause.value} is the machine's, not the code's"
    assert storm([night(2), night(1.5, cause), night(1)], night(0)) is not None, "a preemption between code errors is passed over"


def test_another_cause_between_two_returns_neither_counts_nor_ends_the_streak():
    assert storm([night(2), night(1.5, Cause.CUDA_OOM), night(1)], night(0)) is not None
    assert storm([night(2, Cause.CUDA_OOM), night(1)], night(0)) is None


def test_a_storm_escalates_any_relaunch_but_leaves_a_healthy_run_alone():
    found = storm([night(2), night(1)], night(0))
    crashed = Diagnosis(verdict=Verdict.CRASHED, cause=Cause.ERROR)
    assert across_nights(Action.FULL_RECOVERY, "unexplained error", crashed, found, place(Ledger(host="h"), [], None, [], None))[0] is (
        Action.ESCALATE
    )
    healthy = Diagnosis(verdict=Verdict.HEALTHY)
    assert across_nights(Action.NONE, "running well", healthy, found, place(Ledger(host="h"), [], None, [], None)) == (
        Action.NONE,
        "running well",
    )


def test_a_history_keeps_the_newest_nights_within_what_a_prefect_variable_holds():
    import json

    from prefect.types import MAX_VARIABLE_VALUE_LENGTH

    history = History(target="t")
    for i in range(60):
        history = history.with_night(night(60 - i).model_copy(update={"flow_run": f"{i:036d}"}))
    assert len(json.dumps(history.model_dump(mode="json"))) < MAX_VARIABLE_VALUE_LENGTH
    assert history.nights[-1].flow_run == f"{59:036d}" and len(history.nights) >= 10


# ---- the GPU ledger ----------------------------------------------------------------------------------------


def snapshot_of(kernel_fixture: str, gpu_health=TWO_GPUS) -> HealthSnapshot:
    kernel = clean_lines((XID / kernel_fixture).read_text())
    return HealthSnapshot(launched=True, exit_code=1, kernel_lines=kernel, gpu_health=gpu_health)


def test_an_xid_79_ledgers_the_gpu_by_bus_id_index_uuid_and_serial_as_the_driver_named_them():
    (fault,) = gpu_faults(snapshot_of("xid79_journal.txt"), [0])
    assert (fault.bus_id, fault.index, fault.uuid, fault.serial) == (
        "00000000:00:06.0",
        0,
        "GPU-b30686fb-50e5-b296-a563-b7746cd0b24a",
        "0",
    )
    assert fault.reason == "Xid 79: GPU has fallen off the bus"
    assert gpu_faults(snapshot_of("xid79_journal.txt"), [1]) == [], "another job's GPU is not ledgered for this target"


def test_an_xid_48_then_64_is_one_ledger_entry_for_the_one_gpu():
    (fault,) = gpu_faults(snapshot_of("xid48_journal.txt"), None)
    assert (fault.bus_id, fault.index, fault.reason) == ("00000000:00:06.0", 0, "Xid 48: double-bit ECC error: uncorrectable memory error")


def test_a_gpu_that_fell_off_the_bus_without_an_xid_and_left_nvidia_smi_is_ledgered_by_its_kernel_bus_id():
    (fault,) = gpu_faults(snapshot_of("fallen_off_bus_multiline.txt", gpu_health=[]), None)
    assert (fault.bus_id, fault.index) == ("0000:00:06.0", None)
    assert fault.reason == "NVRM: fallen off the bus and is not responding to commands."


def ledger_with_gpu0() -> Ledger:
    return Ledger(host="gpu-host").with_faults(gpu_faults(snapshot_of("xid79_journal.txt"), None), NOW, "t", "run-1")


def test_a_gpu_seen_again_is_one_entry_counted_twice_and_a_cleared_one_is_gone():
    again = ledger_with_gpu0().with_faults(gpu_faults(snapshot_of("xid48_journal.txt"), None), NOW + timedelta(days=1), "t")
    (entry,) = again.gpus
    assert entry.times == 2 and entry.first_seen == NOW and entry.uuid == "GPU-b30686fb-50e5-b296-a563-b7746cd0b24a"
    assert entry.reason.startswith("Xid 48")
    cleared, removed = again.without("0000:00:06")  # the kernel's way of writing it clears nvidia-smi's
    assert removed is entry and cleared.gpus == []


def test_a_ledgered_gpu_with_no_spare_blocks_every_relaunch_naming_it():
    placement = place(ledger_with_gpu0(), TWO_GPUS, [0], [], None)
    assert placement.blocked
    assert placement.why.startswith("GPU 0 (PCI 00000000:00:06.0, GPU-b30686fb-50e5-b296-a563-b7746cd0b24a, serial 0) in the GPU ledger")
    crashed = Diagnosis(verdict=Verdict.CRASHED, cause=Cause.DISTRIBUTED_FAILURE)
    action, why = across_nights(Action.RELAUNCH, "collective failed", crashed, None, placement)
    assert action is Action.ESCALATE and "never given back to a relaunch" in why and "relaunch gpus clear" in why


def test_a_ledgered_gpu_is_swapped_for_a_spare_keeping_the_world_size():
    placement = place(ledger_with_gpu0(), TWO_GPUS, [0], [1], None)
    assert placement.visible == [1] and not placement.blocked
    gpu_fault = Diagnosis(verdict=Verdict.CRASHED, cause=Cause.GPU_FAULT)
    action, why = across_nights(Action.ESCALATE, "a GPU failed", gpu_fault, None, placement)
    assert action is Action.RELAUNCH and "relaunched on GPUs 1 (swapped for spare GPU(s) 1" in why


def test_a_smaller_world_is_used_only_where_the_trainer_accepts_it():
    assert place(ledger_with_gpu0(), TWO_GPUS, [0, 1], [], None).blocked
    assert place(ledger_with_gpu0(), TWO_GPUS, [0, 1], [], 1).visible == [1]
    assert place(ledger_with_gpu0(), TWO_GPUS, [0, 1], [], 2).blocked


def test_a_ledgered_gpu_outside_the_targets_gpus_changes_nothing():
    assert place(ledger_with_gpu0(), TWO_GPUS, [1], [], None).banned == []


def test_a_target_that_uses_every_gpu_of_the_host_is_kept_off_the_ledgered_one():
    assert place(ledger_with_gpu0(), TWO_GPUS, None, [], 1).visible == [1]


# ---- incidents across the fleet ----------------------------------------------------------------------------


def sick(index: int, host: str, minutes: float, cause: Cause | None = Cause.DISK_FULL, verdict: Verdict | None = Verdict.CRASHED) -> Sick:
    return Sick(index=index, target=f"t{index}", host=host, verdict=verdict, cause=cause, failed_at=NOW + timedelta(minutes=minutes))


def unreachable(index: int, host: str, minutes: float) -> Sick:
    return sick(index, host, minutes, cause=None, verdict=None)


def test_one_cause_on_several_hosts_within_the_window_is_one_incident_recovering_the_first_target_first():
    (incident,) = incidents([sick(2, "b", 1), sick(0, "a", 0), sick(5, "c", 3), sick(7, "d", 30)], window_minutes=10)
    assert incident.hosts == ["a", "b", "c"] and [m.index for m in incident.members] == [0, 2, 5]
    assert incident.summary().startswith("one incident: crashed/disk_full on 3 hosts (a, b, c) within 3.0 min; t0 is recovered first")


def test_two_targets_of_one_host_or_two_causes_are_no_incident():
    assert incidents([sick(0, "a", 0), sick(1, "a", 1)], window_minutes=10) == []
    assert incidents([sick(0, "a", 0), sick(1, "b", 1, Cause.ERROR)], window_minutes=10) == []
    assert incidents([sick(0, "a", 0), sick(1, "b", 11)], window_minutes=10) == []


@given(st.lists(st.sampled_from(list(Verdict)), min_size=2, max_size=12), st.sampled_from([None, *Cause]))
def test_only_a_failure_shared_by_hosts_is_an_incident_and_a_fleet_never_launched_is_none(verdicts, cause):
    found = incidents([sick(i, f"h{i}", 0, cause, v) for i, v in enumerate(verdicts)], window_minutes=10)
    grouped = [v for v in dict.fromkeys(verdicts) if v.is_failure() and verdicts.count(v) >= 2]
    assert sorted(i.verdict for i in found) == sorted(grouped), found
    assert all(i.verdict.is_failure() for i in found), "unknown (nothing on record), healthy, stopped: never an incident"


def test_hosts_that_cannot_be_reached_within_the_window_are_one_partition_apart_from_the_crashes_on_other_hosts():
    found = incidents(
        [unreachable(1, "b", 0), sick(0, "a", 0), unreachable(3, "c", 2), sick(4, "d", 1), unreachable(5, "e", 30)], window_minutes=10
    )
    (partition, crashes) = sorted(found, key=lambda i: i.label, reverse=True)
    assert (partition.label, partition.hosts, partition.unreachable) == ("unreachable", ["b", "c"], True), partition
    assert partition.summary().startswith("one incident: unreachable on 2 hosts (b, c) within 2.0 min; a network partition or hosts down:")
    assert "nothing is stopped or launched on them" in partition.summary()
    assert (crashes.label, crashes.hosts, crashes.unreachable) == ("crashed/disk_full", ["a", "d"], False), crashes


def test_one_unreachable_host_is_no_incident_and_a_sick_target_on_a_partitioned_host_is_cut_off_from_recovery():
    assert incidents([unreachable(0, "a", 0), sick(1, "b", 0)], window_minutes=10) == []
    # Host a's crash and host c's would be one incident, host a's recovered first: cut off, it is neither.
    everyone = [unreachable(0, "a", 0), unreachable(1, "b", 0), sick(2, "a", 0, Cause.ERROR), sick(3, "c", 0, Cause.ERROR)]
    (partition,) = incidents(everyone, window_minutes=10)
    assert cut_off([partition], everyone) == {2: partition}, "host a's crashed target is held; host c's is recovered"


def test_a_run_on_no_gpu_is_never_held_back_by_the_hosts_ledger():
    assert place(ledger_with_gpu0(), [], None, [], None) == place(Ledger(host="gpu-host"), [], None, [], None)
    assert place(ledger_with_gpu0(), [], target_gpus(None, 2), [], None).blocked, "a GPU run whose GPUs nvidia-smi cannot list is"
