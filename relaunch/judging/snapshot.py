"""What one health poll sees. Collected in one round trip by tasks/health.py, judged by relaunch.judging.diagnosis."""

from __future__ import annotations

from pydantic import BaseModel, Field


class GpuSample(BaseModel):
    index: int
    memory_used_mib: int
    utilization_percent: int


class DiskFree(BaseModel):
    path: str = Field(description="The folder asked about (log_dir, checkpoint_dir, /dev/shm).")
    available_bytes: int
    size_bytes: int

    @property
    def available_gb(self) -> float:
        return self.available_bytes / 1e9


class GpuApp(BaseModel):
    """A process holding GPU memory (nvidia-smi's compute apps; PIDs as the host's namespace numbers them)."""

    pid: int
    used_memory_mib: int


class OpenWrite(BaseModel):
    """A regular file the run's tree holds open for writing, as seen through its descriptor."""

    size_bytes: int
    mtime_epoch: float = Field(description="Host clock.")
    path: str = Field(description="Where the descriptor points (` (deleted)` when the file was removed under the writer).")


class JournalPoll(BaseModel):
    """One poll of the run, as the host journaled it (RUN/journal): any check's, so history spans checks."""

    at_epoch: float = Field(description="Host clock when the poll looked.")
    cpu_ticks: int = Field(description="CPU time of the run's process tree, in clock ticks (USER_HZ, 100 a second).")
    log_size_bytes: int = 0
    written_bytes: int = Field(0, description="Sum of the sizes of the files the tree held open for writing.")
    written_mtime_epoch: float = Field(0.0, description="Newest mtime of those files.")
    checkpoint_mtime_epoch: float | None = None


class JournalStep(BaseModel):
    """The highest step a poll read in the log, journaled by the next poll (the host does not parse step lines)."""

    at_epoch: float
    step: int


class ProcessSample(BaseModel):
    """One process of the run's tree in one sample of its progress record (relaunch/host/recorder.sh)."""

    pid: int
    state: str = Field(description="/proc/PID/stat's state: R running, S sleeping, D uninterruptible, T stopped, t traced, Z zombie.")
    cpu_ticks: int = Field(description="utime+stime+cutime+cstime, clock ticks (USER_HZ, 100 a second).")
    io_bytes: int = Field(description="rchar+wchar of /proc/PID/io: bytes read and written by its system calls (files, pipes, sockets).")
    wchan: str = Field("0", description="Where in the kernel it waits (/proc/PID/wchan; 0: running, or not readable).")
    comm: str = ""


class LockWait(BaseModel):
    """A process of the tree blocked on a file lock (flock, fcntl), and the process that holds it (/proc/locks)."""

    waiter_pid: int
    holder_pid: int
    holder_comm: str = ""


class GpuUse(BaseModel):
    """One GPU in one sample: how busy, how full."""

    index: int
    utilization_percent: int
    memory_used_mib: int
    bus_id: str = ""


class ProgressSample(BaseModel):
    """One sample of the run's progress record: the host's own evidence at one moment."""

    at_epoch: float = Field(description="Host clock.")
    log_size_bytes: int = 0
    processes: list[ProcessSample] = Field(default_factory=list)
    lock_waits: list[LockWait] = Field(default_factory=list)
    gpus: list[GpuUse] = Field(default_factory=list, description="Empty where the sample read no GPU (none, or not asked).")
    gpu_apps: list[GpuApp] = Field(default_factory=list, description="GPU memory held by the tree's processes.")
    gpu_app_buses: dict[int, str] = Field(default_factory=dict, description="PID -> bus id of the GPU its memory is on.")


class HealthSnapshot(BaseModel):
    """Raw signals of one poll; nothing here is interpreted yet."""

    host: str = Field("local", description="Host label, for evidence lines.")
    launched: bool = Field(description="A launch by relaunch is on record, or the configured session exists.")
    run_id: str | None = Field(None, description="The attempt the signals belong to.")
    session_alive: bool = Field(False, description="`tmux has-session` succeeded.")
    pid: int | None = Field(None, description="Recorded trainer PID.")
    pid_alive: bool = Field(False, description="The recorded PID is alive with its recorded start time.")
    exit_code: int | None = Field(None, description="Written by the launcher when the trainer exited.")
    exit_at_epoch: float | None = Field(None, description="When the exit code was recorded (RUN/exit_code's mtime, host clock).")
    supervisor_alive: bool = Field(
        False, description="The run's supervisor (which records the trainer's exit code once its log writer drained) still lives."
    )
    repo_dir_missing: str | None = Field(None, description="The target's repo_dir, where it does not exist on the host.")
    exit_masked: str | None = Field(
        None,
        description="Why an exit_code of 0 is not the trainer's: the launch command is a wrapper script whose trainer "
        "wrote into a pipe (`python train.py | tee -a log`), so its status is the pipeline's last command's (RUN/exit_masked).",
    )
    seconds_since_launch: float | None = Field(None, description="Host clock now minus recorded start.")
    seconds_since_log_write: float | None = Field(None, description="Host clock now minus the log's mtime.")
    log_size_bytes: int = Field(0, description="Size of the attempt's log.")
    log_tail: list[str] = Field(default_factory=list, description="Last lines of the log.")
    log_matches: list[str] = Field(
        default_factory=list,
        description="Earliest failure-looking lines of the log with the lines before them, in log order, none of them in log_tail.",
    )
    gpus: list[GpuSample] = Field(default_factory=list, description="One sample per GPU; empty where nvidia-smi is absent.")
    kernel_lines: list[str] = Field(default_factory=list, description="Kernel log lines about OOM kills, where readable.")
    gpu_query_error: str | None = Field(None, description="nvidia-smi failed: its exit code and output.")
    gpu_health: list[GpuHealth] = Field(default_factory=list, description="PCI bus id and ECC / retirement / remap counters per GPU.")
    kernel_readable: bool | None = Field(None, description="dmesg could be read (None: not asked, the trainer was alive).")
    disks: list[DiskFree] = Field(default_factory=list, description="Free space where logs, checkpoints and shared memory live.")
    checkpoint: str | None = Field(None, description="The checkpoint this attempt was launched with, from its run record.")
    launched_gpus: str | None = Field(
        None,
        description="CUDA_VISIBLE_DEVICES this attempt was launched with, from its run record ('-': none set; None: no record read).",
    )
    log_mtime_epoch: float | None = Field(None, description="When the log was last written, host clock, seconds since the epoch.")
    state_owner: str | None = Field(None, description="STATE/target names another target: nothing else was read (the poll refuses).")
    stopped_at: float | None = Field(
        None, description="`relaunch stop` stopped this target on purpose at this host time (STATE/stopped); cleared by a recovery."
    )
    stopped_how: str | None = Field(
        None, description="How the deliberate stop came (STATE/stopped_how): the tmux session ended; None: `relaunch stop`."
    )
    adopted: bool = Field(
        False, description="The current run was started by hand and adopted (its record says so), not launched by relaunch."
    )
    tree_pids: list[int] = Field(
        default_factory=list,
        description="Every PID seen in the current run's process tree by this or earlier polls (RUN/tree): kernel lines about others are not its.",
    )
    checkpoint_mtime_epoch: float | None = Field(
        None, description="Newest modification time of anything in checkpoint_dir (host clock): a save in progress is progress."
    )
    foreign: list[str] = Field(
        default_factory=list,
        description="`PID COMMAND` of each top process in the target's tmux session that is not the current run's "
        "(a run started or restarted by hand, a program that is not a trainer).",
    )
    foreign_log: str | None = Field(
        None, description="The log that foreign run writes (a `tee` argument, or its stdout), where one was found."
    )
    log_followed: str | None = Field(
        None,
        description="The log was renamed under the live trainer (rotation by rename): this is the file it writes, which the poll read instead of the recorded log_path.",
    )
    host_now_epoch: float | None = Field(None, description="The host's clock when the poll looked.")
    tree_cpu_ticks: int | None = Field(
        None, description="CPU time of the live trainer's process tree, clock ticks (utime+stime, reaped children's too)."
    )
    tree_wchar_bytes: int | None = Field(None, description="Bytes the live tree wrote anywhere (files, pipes, sockets).")
    writing: list[OpenWrite] = Field(default_factory=list, description="Regular files the live tree holds open for writing.")
    stacks: str | None = Field(None, description="py-spy dumps of the tree's Python processes, where the poll was asked for them.")
    journal: list[JournalPoll] = Field(default_factory=list, description="The run's earlier polls, oldest first (this one last).")
    journal_steps: list[JournalStep] = Field(default_factory=list, description="The steps earlier polls read, oldest first.")
    progress: list[ProgressSample] = Field(
        default_factory=list,
        description="The run's progress record (RUN/progress), thinned, oldest first, with a sample of the poll's own moment last; "
        "empty where the trainer is not alive.",
    )
    gpu_apps: list[GpuApp] = Field(default_factory=list, description="Processes holding GPU memory, while the trainer lives.")
    own_log: str | None = Field(
        None, description="A log of the trainer's own (a file its tree writes that looks like a log, not the recorded one)."
    )
    own_log_tail: list[str] = Field(default_factory=list, description="Last lines of own_log.")
    strays: list[str] = Field(
        default_factory=list,
        description="`PID HOW COMMAND` of this target's trainers relaunch has no record of, found with no live trainer on "
        "record (HOW: `marker`, its RELAUNCH_TARGET; `program`, the launch command's program running in repo_dir).",
    )
    survivors: list[str] = Field(
        default_factory=list,
        description="`PID COMMAND` of the current run's own processes (its marker) alive after its recorded trainer ended.",
    )
    unfinished_steps: list[str] = Field(
        default_factory=list, description="Steps a killed recovery left half done (their markers are still on the host)."
    )


class GpuHealth(BaseModel):
    """One GPU's identity and error counters, as `nvidia-smi --query-gpu` reports them (None: not reported)."""

    index: int
    pci_bus_id: str = ""
    ecc_uncorrected: int | None = Field(None, description="Volatile uncorrectable ECC errors since the driver loaded.")
    retired_pages_pending: bool | None = Field(None, description="A page retirement waits for a GPU reset.")
    remapped_rows_pending: bool | None = Field(None, description="A row remap waits for a GPU reset.")
    remapped_rows_failure: bool | None = Field(None, description="Row remapping failed: the GPU needs service.")
