"""Before a hung run is stopped: every trainer thread's Python stack, kept as `STATE/stacks/STAMP.txt`.

py-spy reads a live process's stacks without stopping it. relaunch brings it to the host once, into a
small tools venv under its state folder (with the target's own package indexes), so nothing is added
to the trainer's venv. If py-spy cannot be had or cannot attach (no ptrace in a container), the
report says why, and the stop goes ahead: a hang is never left running for want of a stack.
"""

from __future__ import annotations

import re

from relaunch.config import Target
from relaunch.host import host_script
from relaunch.judging.snapshot import HealthSnapshot
from relaunch.plans.rebuild_venv import installer_flags
from relaunch.runlayout import utc_stamp
from relaunch.steps import StacksDetail, StepRecord
from relaunch.tasks.common import execute, log, step_task, timed
from relaunch.vocabulary import Step
from relaunch.wire.commands import script

TOP_FRAMES = 3

# Print the path of a usable py-spy, installing it into STATE/tools once; exit 3 with the reason if none.
ENSURE_PYSPY = host_script("ensure_pyspy")

# Dump each live process of the recorded trainer's group (the supervisor leads it); save and print.
DUMP = host_script("dump_stacks")

THREAD = re.compile(r'^Thread (?P<tid>\S+) \((?P<state>[^)]*)\): "(?P<name>[^"]*)"')


def top_frames(dump: str, frames: int = TOP_FRAMES) -> list[str]:
    """One line per thread: its name and state, then its innermost frames (py-spy lists them innermost first)."""
    lines: list[str] = []
    current: list[str] | None = None
    for raw in dump.splitlines():
        m = THREAD.match(raw)
        if m:
            current = []
            lines.append(f"{m['name']} ({m['state']}): ")
        elif current is not None and raw.startswith("    ") and len(current) < frames:
            current.append(raw.strip())
            lines[-1] = lines[-1].split(": ", 1)[0] + ": " + " <- ".join(current)
    return lines


def gpu_side(snap: HealthSnapshot) -> str:
    """Busy GPUs under a hung host process point to a GPU-side hang; idle ones to the host side."""
    if not snap.gpus:
        return "no GPUs reported: a host-side hang (a deadlock, a stuck data loader)"
    busy = [g.index for g in snap.gpus if g.utilization_percent > 0]
    if busy:
        return f"GPUs {busy} busy while no step completes: a GPU-side hang (a kernel or a collective that never ends)"
    return "every GPU idle: a host-side hang (a deadlock, a stuck data loader, a rank waiting in a collective)"


@step_task("capture_stacks", retries=0)
def capture_stacks(target: Target, snapshot: HealthSnapshot) -> StepRecord:
    detail = StacksDetail()
    with timed() as clock:
        detail.gpus = gpu_side(snapshot)
        found = execute(
            target,
            script(
                ENSURE_PYSPY,
                f"{target.state_path}/tools",
                target.python,
                *installer_flags(target),
                label="bring py-spy",
                timeout_seconds=600,
            ),
            check=False,
        )
        if found.exit_code != 0:
            detail.skipped = (found.stdout.strip() or found.stderr.strip())[-300:]
            log().warning("no stacks for the hung run of %s: %s; stopping it anyway", target.name, detail.skipped)
        else:
            path = f"{target.state_path}/stacks/{utc_stamp()}.txt"
            dump = execute(
                target,
                script(DUMP, found.stdout.strip().splitlines()[-1], target.state_path, path, label="py-spy dump", timeout_seconds=300),
                check=False,
            )
            detail.stacks_file = path if dump.exit_code == 0 else None
            detail.top_frames = top_frames(dump.stdout)
            if dump.exit_code != 0 or not detail.top_frames:
                detail.skipped = f"py-spy could not read the stacks: {(dump.stdout + dump.stderr).strip()[-300:]}"
                log().warning("%s; stopping the hung run anyway", detail.skipped)
    return StepRecord(step=Step.CAPTURE_STACKS, seconds=clock.seconds, detail=detail)
