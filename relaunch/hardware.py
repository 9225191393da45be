"""Evidence that the machine, not the program, failed: a GPU or a disk. Pure functions over a snapshot."""

from __future__ import annotations

import re

from relaunch.config import Target
from relaunch.gpufaults import XID_LINE, GpuHealth, gpu_for_pci, health_problems, parse_xids
from relaunch.snapshot import DiskFree, HealthSnapshot

LOST = re.compile(r"fallen off the bus|GPU is lost")
NAMED = re.compile(r"NVRM: The NVIDIA GPU [0-9A-Fa-f:.]+")
# A PCI address a kernel line names a GPU by: `PCI:0000:3b:00`, `GPU 0000:3b:00.0`, `NVIDIA GPU 0000:b3:00.0`.
PCI_NAMED = re.compile(r"(?:PCI:|GPU )(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?)")

# A disk is really full under max(64 MiB, 0.1 % of its size) free, and under a tenth of its size (a tiny folder,
# mostly empty, is not full). Below that a write fails or is about to; above it a death has other reasons: a run
# SIGKILLed on a fairly full disk (say 2 GB of 1 TB free) was read disk_full and never relaunched.
FULL_FLOOR_BYTES = 64 << 20
FULL_FRACTION = 0.001


def gpu_fault_evidence(snap: HealthSnapshot, expected_gpus: int, gpu_indexes: list[int] | None = None) -> list[str]:
    """Lines naming the failed GPU (index, PCI bus id), the Xid and its meaning; empty when no GPU of the target failed.

    gpu_indexes: the target's GPUs (from CUDA_VISIBLE_DEVICES); None: every GPU of the host is the target's. A kernel
    line about a GPU the poll knows to be another (its bus id is that of a GPU outside gpu_indexes) is another job's.
    A bus id the poll does not list (a GPU that fell off the bus leaves nvidia-smi) may be the target's: it counts."""
    lines = []
    for xid in parse_xids(snap.kernel_lines):
        if not xid.hardware or not targets_gpu(xid.pci, snap.gpu_health, gpu_indexes):
            continue
        gpu = gpu_for_pci(xid.pci, snap.gpu_health)
        who = f"GPU {gpu.index} (PCI {gpu.pci_bus_id})" if gpu else f"the GPU at PCI {xid.pci}"
        lines.append(f"{who}: Xid {xid.number}: {xid.meaning}")
        lines.append(xid.line)
    lost: list[str] = []
    for _, said in lost_gpus(snap, gpu_indexes):
        # The naming line once, however many lines it names; each lost line as the kernel said it.
        lost += [line for line in said[:-1] if line not in lost] + said[-1:]
    lines += lost
    if snap.gpu_query_error:
        lines.append(snap.gpu_query_error)
    elif expected_gpus and snap.gpus and len(snap.gpus) < expected_gpus:
        lines.append(f"nvidia-smi lists {len(snap.gpus)} GPU(s), {expected_gpus} expected: a GPU is missing (fallen off the bus?)")
    lines += health_problems([g for g in snap.gpu_health if gpu_indexes is None or g.index in gpu_indexes])
    return lines


def gpu_indexes_of(target: Target, snap: HealthSnapshot | None = None) -> list[int] | None:
    """The target's GPUs from CUDA_VISIBLE_DEVICES: kernel lines about other GPUs are another job's. The value the
    current run was launched with where the poll read its run record (`snap`): a recovery may have placed it on other
    GPUs than the target's own setting (a spare, off a GPU in the ledger); else the target's env.

    None (every GPU of the host counts as the target's) when unset, or when it names GPUs by UUID or MIG
    instance: the poll knows GPUs by index only."""
    if snap is not None and snap.launched_gpus is not None:
        value = None if snap.launched_gpus == "-" else snap.launched_gpus
    else:
        value = target.env.get("CUDA_VISIBLE_DEVICES")
    parts = [p.strip() for p in value.split(",")] if value is not None else []
    return [int(p) for p in parts] if parts and all(p.isdigit() for p in parts) else None


def lost_gpus(snap: HealthSnapshot, gpu_indexes: list[int] | None = None) -> list[tuple[str | None, list[str]]]:
    """(bus id or None, the kernel lines saying it) for each target's GPU the kernel says is lost, with no Xid.

    Newer drivers say "fallen off the bus" over several lines with no Xid; GPU-lost has none either.
    Each is the GPU named on its own line or the nearest line before it ("NVRM: The NVIDIA GPU 0000:b3:00.0")."""
    named: tuple[str, str] | None = None  # (bus id, the line that named it)
    out: list[tuple[str | None, list[str]]] = []
    for line in snap.kernel_lines:
        m = PCI_NAMED.search(line)
        named = (m["pci"], line.strip()) if m else named
        if not LOST.search(line) or XID_LINE.search(line):
            continue
        if named is not None and not targets_gpu(named[0], snap.gpu_health, gpu_indexes):
            continue  # another job's GPU fell off the bus
        said = [f"kernel: {named[1]}"] if named is not None and named[1] != line.strip() else []
        out.append((named[0] if named else None, [*said, f"kernel: {line.strip()}"]))
    return out


def targets_gpu(pci: str, gpus: list[GpuHealth], gpu_indexes: list[int] | None) -> bool:
    """The GPU at this bus id may be the target's: all are (None), or it is one of them, or the poll does not know it."""
    if gpu_indexes is None:
        return True
    gpu = gpu_for_pci(pci, gpus)
    return gpu is None or gpu.index in gpu_indexes


def really_full(disk: DiskFree) -> bool:
    """Writes fail or are about to: see FULL_FLOOR_BYTES."""
    floor = max(FULL_FLOOR_BYTES, disk.size_bytes * FULL_FRACTION)
    return disk.size_bytes > 0 and disk.available_bytes < floor and disk.available_bytes < disk.size_bytes / 10


def full_disk_evidence(snap: HealthSnapshot) -> list[str]:
    """Lines naming each watched folder on a really full disk (not /dev/shm: its own words say when it fills)."""
    return [
        f"only {human_size(d.available_bytes)} free of {human_size(d.size_bytes)} at {d.path}: the disk is full "
        f"(under max(64 MiB, 0.1 %) free): free space, then recover"
        for d in snap.disks
        if d.path != "/dev/shm" and really_full(d)
    ]


def disk_full_evidence(snap: HealthSnapshot, min_free_disk_gb: float) -> list[str]:
    """Lines naming each watched folder with less free space than the minimum; empty when all have room."""
    if min_free_disk_gb <= 0:
        return []
    return [
        f"only {human_size(d.available_bytes)} free of {human_size(d.size_bytes)} at {d.path} (minimum {min_free_disk_gb:g} GB): free space, then recover"
        for d in snap.disks
        if d.path != "/dev/shm" and d.available_gb < min_free_disk_gb
    ]


def human_size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
