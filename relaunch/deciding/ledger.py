"""The GPU ledger: every GPU a target's run saw fail, per host, across nights; and where a relaunch may run instead.

Pure: tasks/memory.py keeps one ledger per host in a Prefect Variable. A GPU stays in the ledger until a person clears
it (`relaunch gpus clear HOST BUS_ID`) after a repair; until then no relaunch of a target is given it back: the target
runs on its spare GPUs, or on fewer GPUs where its trainer accepts that (`spare_gpus`, `min_gpus`), or is escalated.
"""

from __future__ import annotations

import re
from datetime import datetime

from pydantic import BaseModel, Field

from relaunch.judging.hardware import bus_key, gpu_for_pci, health_problems, lost_gpus, parse_xids, targets_gpu
from relaunch.judging.snapshot import GpuHealth, HealthSnapshot

# The driver names a GPU's UUID and serial number as it reports a fault (xid79_journal.txt):
# `NVRM: GPU at PCI:0000:00:06: GPU-b30686fb-...`, `NVRM: GPU 0000:00:06.0: GPU serial number is 0.`
UUID_LINE = re.compile(r"GPU at PCI:(?P<pci>[0-9A-Fa-f:.]+): (?P<uuid>GPU-[0-9A-Fa-f-]{36})")
SERIAL_LINE = re.compile(
    r"GPU (?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?): GPU serial number is (?P<serial>\S+?)\.?$"
)


class GpuFault(BaseModel):
    """One GPU a poll found failed, named as well as the host let it be named."""

    bus_id: str = Field(description="PCI bus id: nvidia-smi's form where it lists the GPU, else the kernel's.")
    index: int | None = Field(None, description="nvidia-smi's index at the time, where it listed the GPU.")
    uuid: str | None = Field(None, description="GPU-... as the driver named it, where it did.")
    serial: str | None = Field(None, description="Board serial number as the driver named it, where it did.")
    reason: str = Field(description="The evidence line that put it in the ledger.")


class LedgerEntry(GpuFault):
    first_seen: datetime
    last_seen: datetime
    times: int = Field(1, description="Recoveries that found this GPU failed.")
    target: str = Field(description="The target whose run found it last.")
    flow_run: str = Field("", description="The recover-training flow run that found it last.")

    def name(self) -> str:
        ids = ", ".join(x for x in (f"PCI {self.bus_id}", self.uuid, f"serial {self.serial}" if self.serial else None) if x)
        index = f"GPU {self.index}" if self.index is not None else "the GPU"
        return f"{index} ({ids})"

    def line(self) -> str:
        return f"{self.name()} in the GPU ledger since {self.first_seen:%Y-%m-%d %H:%M} UTC ({self.reason})"


class Ledger(BaseModel):
    """One host's failed GPUs (what its Prefect Variable holds)."""

    host: str
    gpus: list[LedgerEntry] = Field(default_factory=list)

    def find(self, bus_id: str) -> LedgerEntry | None:
        return next((e for e in self.gpus if bus_key(e.bus_id) == bus_key(bus_id)), None)

    def with_faults(self, faults: list[GpuFault], at: datetime, target: str, flow_run: str = "") -> Ledger:
        """The ledger with each fault recorded: a GPU already in it is seen again (its ids filled in where now known)."""
        gpus = list(self.gpus)
        for fault in faults:
            old = next((i for i, e in enumerate(gpus) if bus_key(e.bus_id) == bus_key(fault.bus_id)), None)
            if old is None:
                gpus.append(LedgerEntry(**fault.model_dump(), first_seen=at, last_seen=at, target=target, flow_run=flow_run))
                continue
            e = gpus[old]
            gpus[old] = e.model_copy(
                update={
                    "last_seen": at,
                    "times": e.times + 1,
                    "target": target,
                    "flow_run": flow_run,
                    "reason": fault.reason,
                    "index": fault.index if fault.index is not None else e.index,
                    "uuid": fault.uuid or e.uuid,
                    "serial": fault.serial or e.serial,
                }
            )
        return Ledger(host=self.host, gpus=gpus)

    def without(self, bus_id: str) -> tuple[Ledger, LedgerEntry | None]:
        entry = self.find(bus_id)
        return Ledger(host=self.host, gpus=[e for e in self.gpus if e is not entry]), entry

    def rows(self) -> list[dict[str, object]]:
        """The table artifact's rows and `relaunch gpus`' lines."""
        return [
            {
                "host": self.host,
                "bus_id": e.bus_id,
                "index": e.index,
                "uuid": e.uuid or "",
                "serial": e.serial or "",
                "reason": e.reason,
                "first_seen": e.first_seen.isoformat(timespec="seconds"),
                "last_seen": e.last_seen.isoformat(timespec="seconds"),
                "times": e.times,
                "target": e.target,
            }
            for e in self.gpus
        ]


def gpu_faults(snap: HealthSnapshot, gpu_indexes: list[int] | None = None) -> list[GpuFault]:
    """The target's GPUs this poll names as failed (a hardware Xid, fallen off the bus, ECC/remap counters), one each.

    A failure no line ties to a GPU (a CUDA ECC error in the trainer's own log, a GPU missing from nvidia-smi) names
    none: the playbook escalates it, and nothing can be ledgered."""
    found: dict[str, GpuFault] = {}

    def add(pci: str, reason: str) -> None:
        gpu = gpu_for_pci(pci, snap.gpu_health)
        key = bus_key(pci)
        if key not in found:
            found[key] = GpuFault(bus_id=gpu.pci_bus_id if gpu else pci, index=gpu.index if gpu else None, reason=reason)

    for xid in parse_xids(snap.kernel_lines):
        if xid.hardware and targets_gpu(xid.pci, snap.gpu_health, gpu_indexes):
            add(xid.pci, f"Xid {xid.number}: {xid.meaning}")
    for pci, said in lost_gpus(snap, gpu_indexes):
        if pci:
            add(pci, said[-1].removeprefix("kernel: "))
    for g in snap.gpu_health:
        problems = health_problems([g]) if gpu_indexes is None or g.index in gpu_indexes else []
        if problems and g.pci_bus_id:
            add(g.pci_bus_id, problems[0])
    for line in snap.kernel_lines:
        for pattern, field in ((UUID_LINE, "uuid"), (SERIAL_LINE, "serial")):
            m = pattern.search(line.strip())
            if m and bus_key(m["pci"]) in found:
                found[bus_key(m["pci"])] = found[bus_key(m["pci"])].model_copy(update={field: m[field]})
    return list(found.values())


class Placement(BaseModel):
    """Where the next launch of a target may run, given the ledger."""

    banned: list[LedgerEntry] = Field(default_factory=list, description="Ledgered GPUs among the ones the target would use.")
    visible: list[int] | None = Field(None, description="CUDA_VISIBLE_DEVICES for the relaunch; None: unchanged (or: cannot run).")
    why: str = ""

    @property
    def blocked(self) -> bool:
        """A ledgered GPU would be given back, and there is nowhere else to run."""
        return bool(self.banned) and self.visible is None


def place(ledger: Ledger, health: list[GpuHealth], target_gpus: list[int] | None, spare_gpus: list[int], min_gpus: int | None) -> Placement:
    """Keep the target off every ledgered GPU: swap each for a spare (world size kept), else run on fewer where the
    trainer accepts at least min_gpus, else block. target_gpus: from ledger.target_gpus (None: all the host lists)."""
    indexed = [(e, _index_now(e, health)) for e in ledger.gpus]
    ours = target_gpus if target_gpus is not None else sorted(g.index for g in health)
    if not ours:
        return Placement()  # no GPU declared, none listed: a run on the CPU, which no GPU of the ledger concerns
    # A ledgered GPU whose index is unknown (it left nvidia-smi, and its index was never seen) may be any of the target's.
    banned = [e for e, i in indexed if i is None or i in ours]
    if not banned:
        return Placement()
    names = "; ".join(e.line() for e in banned)
    bad = {i for _, i in indexed if i is not None}
    if any(i is None for e, i in indexed if e in banned):
        return Placement(banned=banned, why=f"{names}: which GPU index it has now is unknown, so no relaunch can be kept off it")
    good = [g for g in ours if g not in bad]
    spares = [s for s in spare_gpus if s not in bad and s not in ours]
    need = len(ours) - len(good)
    if len(spares) >= need:
        visible = good + spares[:need]
        how = f"swapped for spare GPU(s) {', '.join(map(str, spares[:need]))}"
    elif min_gpus is not None and len(good) + len(spares) >= min_gpus:
        visible = good + spares
        how = f"{len(visible)} GPUs instead of {len(ours)} (the trainer accepts {min_gpus} or more)"
    else:
        spare_note = f"only {len(spares)} usable spare(s)" if spare_gpus else "no spare_gpus"
        fewer = f", min_gpus {min_gpus}" if min_gpus is not None else ", no smaller world allowed (min_gpus)"
        return Placement(
            banned=banned,
            why=f"{names}: never given back to a relaunch, and there is nowhere else to run ({spare_note}{fewer}): "
            "repair or replace it, then `relaunch gpus clear HOST BUS_ID`",
        )
    return Placement(
        banned=banned, visible=visible, why=f"{names}: relaunched on GPUs {','.join(map(str, visible))} ({how}; CUDA_VISIBLE_DEVICES set)"
    )


def target_gpus(visible: list[int] | None, expected_gpus: int) -> list[int] | None:
    """The GPU indexes a target runs on: its CUDA_VISIBLE_DEVICES, else the first expected_gpus, else (None) all listed."""
    if visible is not None:
        return visible
    return list(range(expected_gpus)) if expected_gpus else None


def _index_now(entry: LedgerEntry, health: list[GpuHealth]) -> int | None:
    """Its index as nvidia-smi lists it now (indexes shift when a GPU leaves the bus), else as last seen."""
    gpu = gpu_for_pci(entry.bus_id, health)
    return gpu.index if gpu else entry.index
