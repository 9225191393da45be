"""One decision per attempt: what to do next, on which nodes and GPUs, and what the GPU ledger learns.

The rules live in their rooms (the playbook per cause, the nights for storms and GPU placement, the gang for
nodes); this module is where they meet, in one order, as one pure function that the recovery flow calls once per
attempt. A line of gang or GPU policy goes into its room; the order in which the rooms speak goes here.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from relaunch.config import Target
from relaunch.deciding.gang import NodeHealth, gang_action
from relaunch.deciding.history import Storm, across_nights
from relaunch.deciding.ledger import GpuFault, Ledger, gpu_faults, place, target_gpus
from relaunch.deciding.playbook import choose_action
from relaunch.judging.findings import Diagnosis
from relaunch.judging.hardware import bus_key, gpu_indexes_of
from relaunch.judging.snapshot import HealthSnapshot
from relaunch.vocabulary import Action, Cause


class Decision(BaseModel):
    """What one attempt does, and why: the flow carries it out and records it; it decides nothing itself."""

    action: Action = Field(description="The action to take; NONE and ESCALATE end the recovery.")
    why: str = Field(description="The reason a person reads, every room that changed the action named in it.")
    members: list[int] | None = Field(None, description="The nodes of a gang to act on; None: a target of one host.")
    visible_gpus: list[int] | None = Field(None, description="The GPUs to launch on (CUDA_VISIBLE_DEVICES); None: as configured.")
    ledger: Ledger = Field(description="The GPU ledger with what this attempt's diagnosis found added.")
    faults: list[GpuFault] = Field(default_factory=list, description="Every GPU fault this recovery found, each bus once.")


def decide(
    target: Target,
    diagnosis: Diagnosis,
    snapshot: HealthSnapshot,
    nodes: list[NodeHealth],
    earlier: list[Diagnosis],
    *,
    attempts_left: int,
    force: bool,
    storm: Storm | None,
    ledger: Ledger,
    faults: list[GpuFault],
    running: Target,
    at: datetime,
    flow_run: str = "",
) -> Decision:
    """The next action for `target`, judged `diagnosis` after the `earlier` attempts' diagnoses.

    `storm`: the restart storm of the last nights, given on the first attempt only (later attempts are this night's).
    `running`: the target as last launched (its CUDA_VISIBLE_DEVICES), whose GPUs a gpu_fault is read against.
    `ledger` and `faults`: what is known so far this recovery; the decision returns them with this attempt's findings.
    """
    # The playbook: what this cause calls for, or an escalation when it repeats without progress or the budget is spent.
    action, why = choose_action(diagnosis, earlier, attempts_left, force=force, unfinished=snapshot.unfinished_steps)
    if diagnosis.cause is Cause.GPU_FAULT:
        found = gpu_faults(snapshot, gpu_indexes_of(running, snapshot))
        faults = faults + [f for f in found if all(bus_key(f.bus_id) != bus_key(g.bus_id) for g in faults)]
        ledger = ledger.with_faults(found, at, target.name, flow_run)
    # The nights: a storm escalates; the ledger places the launch away from GPUs that failed before.
    gpus = target_gpus(gpu_indexes_of(target), target.thresholds.expected_gpus)
    placement = place(ledger, snapshot.gpu_health, gpus, target.spare_gpus, target.min_gpus)
    action, why = across_nights(action, why, diagnosis, storm, placement)
    # The gang: which nodes act, a lost one replaced by a spare or left out, or a person asked to bring it back.
    action, why, members = gang_action(action, why, nodes, target)
    return Decision(action=action, why=why, members=members, visible_gpus=placement.visible, ledger=ledger, faults=faults)
