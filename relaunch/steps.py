"""What each recovery step did, as typed records: one record type for tasks, flows and the report.

Each step's detail is its own model; the report reads fields, not dict keys, and asks each detail for the
notes a person needs (what drifted, where edits were saved, which checkpoint and why).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from relaunch.vocabulary import Step


def counted(n: int, noun: str) -> str:
    """`1 package`, `3 packages`: a count as a person writes it."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class _Detail(BaseModel):
    def notes(self) -> list[str]:
        """The lines of this step a person reads in the report."""
        return []


class PreflightDetail(_Detail):
    kind: Literal["preflight"] = "preflight"
    problems: int = 0


class LeftoversDetail(_Detail):
    kind: Literal["stop_leftovers"] = "stop_leftovers"
    stopped: list[str] = Field(default_factory=list, description="Host commands of a killed recovery that were stopped.")

    def notes(self) -> list[str]:
        return self.stopped


class StacksDetail(_Detail):
    kind: Literal["capture_stacks"] = "capture_stacks"
    gpus: str = Field("", description="GPU-side or host-side hang, from the GPUs' utilisation.")
    stacks_file: str | None = Field(None, description="STATE/stacks/STAMP.txt on the host.")
    top_frames: list[str] = Field(default_factory=list, description="Each thread: its name, state and innermost frames.")
    skipped: str | None = Field(None, description="Why no stacks were taken (py-spy missing or unable to attach).")

    def notes(self) -> list[str]:
        lines = [f"gpus: {self.gpus}"] if self.gpus else []
        lines += [f"stacks: {self.stacks_file}"] if self.stacks_file else []
        lines += [f"no stacks: {self.skipped}"] if self.skipped else []
        return lines + self.top_frames[:12]


class StopDetail(_Detail):
    kind: Literal["stop"] = "stop"
    output: list[str] = Field(default_factory=list, description="The last lines stop.sh printed.")
    signalled: list[int] = Field(default_factory=list, description="PIDs sent their one SIGTERM (relaunch's or adopted processes only).")
    killed: list[int] = Field(default_factory=list, description="PIDs still alive after the grace, sent SIGKILL.")
    survivors: list[str] = Field(default_factory=list, description="`PID command` of each process alive even after SIGKILL.")
    panes_left: list[str] = Field(
        default_factory=list, description="Other panes of the run's session, left running: `%ID (PID N: command)`."
    )
    deliberate: bool = Field(False, description="A person's stop (`relaunch stop`): STATE/stopped marks the target stopped.")

    def notes(self) -> list[str]:
        lines = [f"SIGTERM: {len(self.signalled)} process(es)"] if self.signalled else []
        lines += [f"SIGKILL after the grace: {' '.join(map(str, self.killed))}"] if self.killed else []
        lines += [f"alive after SIGKILL: {s}" for s in self.survivors]
        lines += [f"left running in the session: {p}" for p in self.panes_left]
        return lines + (["stopped on purpose: checks leave it stopped until `relaunch recover`"] if self.deliberate else [])


class _VenvBuild(_Detail):
    """What building a venv from the lock found: shared by the build aside and the swap that puts it in place."""

    old_venv_drift: list[str] = Field(default_factory=list, description="How the replaced venv differed from the lock.")
    drift: list[str] = Field(default_factory=list, description="How the new venv differs from the lock (should be empty).")
    packages: int = 0
    system_site_packages: bool = Field(False, description="The venv also sees the interpreter's own packages (the image's).")
    from_image: dict[str, str] = Field(
        default_factory=dict, description="Distributions of the import-checked modules the venv takes from the image, and their versions."
    )
    shadowed: list[str] = Field(default_factory=list, description="Packages the lock installs over another version in the image.")

    def build_notes(self) -> list[str]:
        lines = [f"old venv drift: {'; '.join(self.old_venv_drift)}"] if self.old_venv_drift else []
        lines += [f"drift: {'; '.join(self.drift)}"] if self.drift else []
        lines += [f"from the image: {', '.join(f'{n} {v}' for n, v in self.from_image.items())}"] if self.from_image else []
        return lines + ([f"shadows the image: {'; '.join(self.shadowed)}"] if self.shadowed else [])


class BuildDetail(_VenvBuild):
    kind: Literal["build_venv"] = "build_venv"
    built: str = Field("", description="The sibling folder (VENV.new-STAMP) the venv was built in while the run still ran.")
    reused: bool = Field(False, description="A retry found this build already complete and kept it.")

    def notes(self) -> list[str]:
        return [f"built aside at {self.built}" + (" (kept from the first try)" if self.reused else ""), *self.build_notes()]


class RebuildDetail(_VenvBuild):
    kind: Literal["rebuild_venv"] = "rebuild_venv"
    old_venv: str = Field("none", description="Where the replaced venv was moved aside.")
    built: str = Field("", description="Where the new venv was built (VENV.new-STAMP) before it was renamed into place.")
    prepared: bool = Field(False, description="Built by an earlier build_venv step of this recovery (its notes say what it found).")
    pruned: list[str] = Field(default_factory=list, description="Old venvs beyond the kept ones, removed.")

    def notes(self) -> list[str]:
        # A prepared build's findings are in the build_venv step's notes already.
        lines = [] if self.prepared else self.build_notes()
        lines += [f"old venv kept as {self.old_venv}"] if self.old_venv != "none" else []
        return lines + ([f"pruned: {'; '.join(self.pruned)}"] if self.pruned else [])


class InstallDetail(_Detail):
    kind: Literal["install_package"] = "install_package"
    package: str = ""
    added: list[str] = Field(
        default_factory=list, description="NAME==VERSION of each distribution added: the package, and what came with it."
    )
    output: list[str] = Field(default_factory=list)

    def notes(self) -> list[str]:
        if not self.added:
            return [f"installed {self.package}: add it to the lock"]
        came = [a for a in self.added if a.split("==")[0].lower().replace("_", "-") != self.package.lower().replace("_", "-")]
        return [
            f"installed {', '.join(self.added)}" + (f" ({', '.join(came)} came with {self.package})" if came else "") + ": add to the lock"
        ]


class RestoreDetail(_Detail):
    kind: Literal["restore_code"] = "restore_code"
    skipped: str | None = None
    commit: str | None = None
    head: str | None = None
    patch: str | None = Field(None, description="Uncommitted edits saved before the restore (re-applies with git apply).")
    paths: list[str] = Field(default_factory=list)

    def notes(self) -> list[str]:
        lines = [f"patch: {self.patch}"] if self.patch else []
        return lines + ([f"commit: {self.commit}"] if self.commit else [])


class WarmDetail(_Detail):
    kind: Literal["warm_cache"] = "warm_cache"
    cleared_bytes: int = 0
    kept_aside: str | None = Field(
        None, description="The old cache, kept because it held more than compile cache, was in use, or was damaged."
    )
    warmup_output: list[str] = Field(default_factory=list)
    cache_bytes: int = 0

    def notes(self) -> list[str]:
        lines = [f"cache: {self.cache_bytes / 1e6:.1f} MB"]
        return lines + ([f"kept aside: {self.kept_aside}"] if self.kept_aside else [])


class LaunchDetail(_Detail):
    kind: Literal["launch"] = "launch"
    run_id: str
    log_path: str
    pid: int | None
    checkpoint: str | None
    checkpoint_why: str = Field("", description="Why this checkpoint (or none) was chosen, and what was skipped.")
    command: str
    adopted: bool = Field(False, description="A retry after a dropped connection found this run started by the first try, and kept it.")

    def notes(self) -> list[str]:
        return [f"checkpoint: {self.checkpoint_why}"] if self.checkpoint_why else []


class RollbackDetail(_Detail):
    kind: Literal["rollback_venv"] = "rollback_venv"
    restored_from: str | None = None
    rolled_back_to: str | None = None

    def notes(self) -> list[str]:
        return [f"restored {self.restored_from}; kept {self.rolled_back_to}"]


StepDetail = Annotated[
    PreflightDetail
    | LeftoversDetail
    | StacksDetail
    | StopDetail
    | BuildDetail
    | RebuildDetail
    | InstallDetail
    | RestoreDetail
    | WarmDetail
    | LaunchDetail
    | RollbackDetail,
    Field(discriminator="kind"),
]


class StepRecord(BaseModel):
    """One step of a recovery: what ran, how long, what it found or did."""

    step: Step
    seconds: float = Field(description="Wall time of the step.")
    detail: StepDetail
    node: int | None = Field(None, description="The node it ran on, in a run of several nodes (None: a run of one).")
