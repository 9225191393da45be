"""GPU faults from the kernel log and nvidia-smi: which GPU, which Xid, what it means, whether a relaunch can help.

Pure: the host poll collects the lines; this module only reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, Field

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


class GpuHealth(BaseModel):
    """One GPU's identity and error counters, as `nvidia-smi --query-gpu` reports them (None: not reported)."""

    index: int
    pci_bus_id: str = ""
    ecc_uncorrected: int | None = Field(None, description="Volatile uncorrectable ECC errors since the driver loaded.")
    retired_pages_pending: bool | None = Field(None, description="A page retirement waits for a GPU reset.")
    remapped_rows_pending: bool | None = Field(None, description="A row remap waits for a GPU reset.")
    remapped_rows_failure: bool | None = Field(None, description="Row remapping failed: the GPU needs service.")


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
