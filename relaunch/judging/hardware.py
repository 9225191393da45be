"""GPU faults from the kernel log and nvidia-smi: which GPU, which Xid, what it means, whether a relaunch can help.

Pure: the host poll collects the lines; this module only reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from relaunch.config import Target
from relaunch.judging.snapshot import DiskFree, GpuHealth, HealthSnapshot

# NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors), the ones large fleets report most.
# hardware=False: usually the application's own bug (a bad kernel, an illegal address), not the GPU.
XIDS: dict[int, tuple[str, bool]] = {
    13: ("graphics engine exception (often an application bug: out-of-range access in a kernel)", False),
    31: ("GPU memory page fault (usually an application bug: illegal address)", False),
    43: ("GPU stopped processing (usually follows an application fault)", False),
    45: ("preemptive cleanup after earlier errors (look at the Xid before it)", False),
    48: ("double-bit ECC error: uncorrectable memory error", True),
    61: ("internal micro-controller breakpoint/warning", True),
    62: ("internal micro-controller halt", True),
    63: ("ECC page retirement or row remapping recorded: reset the GPU to apply it", True),
    64: ("ECC page retirement or row remapping failed: the GPU needs service", True),
    74: ("NVLink error", True),
    79: ("GPU has fallen off the bus", True),
    92: ("high single-bit ECC error rate", True),
    94: ("contained ECC error: the affected application must restart; the GPU needs a reset", True),
    95: ("uncontained ECC error: every application on the GPU is affected; reset the GPU", True),
    119: ("GSP RPC timeout: the GPU's system processor stopped answering", True),
    120: ("GSP error: the GPU's system processor failed", True),
}

XID_LINE = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+)(?:, pid=(?P<pid>[^,]*))?")
NOT_A_NUMBER = re.compile(r"^\[?(N/A|Not Supported|Unknown Error|Requested functionality has been deprecated)\]?$", re.IGNORECASE)


@dataclass(frozen=True)
class Xid:
    pci: str
    number: int
    line: str

    @property
    def meaning(self) -> str:
        return XIDS.get(self.number, (f"Xid {self.number} (not in relaunch's table: see NVIDIA's Xid catalogue)", True))[0]

    @property
    def hardware(self) -> bool:
        return XIDS.get(self.number, ("", True))[1]


def parse_xids(kernel_lines: list[str]) -> list[Xid]:
    out = []
    for line in kernel_lines:
        m = XID_LINE.search(line)
        if m:
            out.append(Xid(pci=m["pci"], number=int(m["xid"]), line=line.strip()))
    return out


def parse_gpu_health(text: str) -> list[GpuHealth]:
    """Rows of `index, pci.bus_id, ecc.errors.uncorrected.volatile.total, retired_pages.pending,
    remapped_rows.pending, remapped_rows.failure` (csv, noheader, nounits); fields a GPU lacks read None."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 2 or not cells[0].isdigit():
            continue
        cells += [""] * (6 - len(cells))
        rows.append(
            GpuHealth(
                index=int(cells[0]),
                pci_bus_id=cells[1],
                ecc_uncorrected=_int(cells[2]),
                retired_pages_pending=_yes(cells[3]),
                remapped_rows_pending=_yes(cells[4]),
                remapped_rows_failure=_yes(cells[5]),
            )
        )
    return rows


def gpu_for_pci(pci: str, gpus: list[GpuHealth]) -> GpuHealth | None:
    """Xid lines name `0000:3b:00`; nvidia-smi says `00000000:3B:00.0`: compare bus and device only."""
    want = bus_key(pci)
    return next((g for g in gpus if bus_key(g.pci_bus_id) == want), None)


def health_problems(gpus: list[GpuHealth]) -> list[str]:
    """Evidence lines for counters that mean a GPU must be reset or serviced before training on it again."""
    lines = []
    for g in gpus:
        name = f"GPU {g.index} ({g.pci_bus_id})" if g.pci_bus_id else f"GPU {g.index}"
        if g.ecc_uncorrected:
            lines.append(f"{name}: {g.ecc_uncorrected} uncorrectable ECC error(s) since the driver loaded")
        if g.retired_pages_pending:
            lines.append(f"{name}: a page retirement is pending (needs a GPU reset)")
        if g.remapped_rows_pending:
            lines.append(f"{name}: a row remap is pending (needs a GPU reset)")
        if g.remapped_rows_failure:
            lines.append(f"{name}: row remapping failed (the GPU needs service)")
    return lines


def bus_key(pci: str) -> str:
    """The bus and device of a PCI address, the part both ways of writing it agree on (`3b:0`)."""
    parts = pci.lower().split(":")
    # domain:bus:device(.function) -> bus:device, domain and function dropped.
    return ":".join(p.split(".")[0].lstrip("0") or "0" for p in parts[-2:]) if len(parts) >= 2 else pci.lower()


def _int(cell: str) -> int | None:
    return None if not cell or NOT_A_NUMBER.match(cell) else int(cell) if cell.isdigit() else None


def _yes(cell: str) -> bool | None:
    if not cell or NOT_A_NUMBER.match(cell):
        return None
    return cell.lower() in ("yes", "1", "true")


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


def free_space_now(snap: HealthSnapshot) -> list[str]:
    """The poll's free space at each watched folder (not /dev/shm), as one line: what a trainer's word that its disk
    filled is weighed against where no folder is full now. Empty where the poll read no figures (a saved log)."""
    disks = [d for d in snap.disks if d.path != "/dev/shm"]
    if not disks:
        return []
    figures = "; ".join(f"{human_size(d.available_bytes)} free of {human_size(d.size_bytes)} at {d.path}" for d in disks)
    return [f"free space now: {figures}: none full, so the write that failed filled another disk, or space was freed since"]


def human_size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
