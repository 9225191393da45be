"""Evidence that the machine, not the program, failed: a GPU or a disk. Pure functions over a snapshot."""

from __future__ import annotations

import re

from relaunch.gpufaults import XID_LINE, gpu_for_pci, health_problems, parse_xids
from relaunch.snapshot import HealthSnapshot

LOST = re.compile(r"fallen off the bus|GPU is lost")
NAMED = re.compile(r"NVRM: The NVIDIA GPU [0-9A-Fa-f:.]+")


def gpu_fault_evidence(snap: HealthSnapshot, expected_gpus: int) -> list[str]:
    """Lines naming the failed GPU (index, PCI bus id), the Xid and its meaning; empty when no GPU failed."""
    lines = []
    for xid in parse_xids(snap.kernel_lines):
        if not xid.hardware:
            continue
        gpu = gpu_for_pci(xid.pci, snap.gpu_health)
        who = f"GPU {gpu.index} (PCI {gpu.pci_bus_id})" if gpu else f"the GPU at PCI {xid.pci}"
        lines.append(f"{who}: Xid {xid.number}: {xid.meaning}")
        lines.append(xid.line)
    # Newer drivers say "fallen off the bus" over several lines with no Xid; GPU-lost has none either.
    lost = [line.strip() for line in snap.kernel_lines if LOST.search(line) and not XID_LINE.search(line)]
    if lost:
        # The line before names the GPU by its PCI address: "NVRM: The NVIDIA GPU 0000:b3:00.0".
        lines += [f"kernel: {line.strip()}" for line in snap.kernel_lines if NAMED.search(line)] + [f"kernel: {line}" for line in lost]
    if snap.gpu_query_error:
        lines.append(snap.gpu_query_error)
    elif expected_gpus and snap.gpus and len(snap.gpus) < expected_gpus:
        lines.append(f"nvidia-smi lists {len(snap.gpus)} GPU(s), {expected_gpus} expected: a GPU is missing (fallen off the bus?)")
    lines += health_problems(snap.gpu_health)
    return lines


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
