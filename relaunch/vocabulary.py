"""relaunch's one vocabulary: what a check says (Verdict), why a run died (Cause), what a recovery does (Action) and in
which steps (Step), and where the time went (Category). Each enum owns its classes (`Verdict.is_fine`,
`Cause.is_infrastructure`, `Action.steps`, `Step.category`), as Prefect's StateType owns TERMINAL_STATES; every table
keyed by them (the playbook's remedies, the plans, the step runners, the goodput categories) imports down from here,
and tests/test_vocabulary.py checks that each table covers each member. Pure: no I/O, no Prefect."""

from __future__ import annotations

from enum import Enum


class Verdict(str, Enum):
    STARTING = "starting"  # alive, within start-up grace or still making start-up progress; wait
    HEALTHY = "healthy"  # alive, new step lines at or above the degraded threshold
    DEGRADED = "degraded"  # alive and stepping, but tokens/s below degraded_ratio x baseline
    STALLED = "stalled"  # alive, but no new step line (or no start-up progress) for the stall window
    DIVERGED = "diverged"  # alive and stepping, but the loss of the last `diverged_steps` step lines is nan/inf
    CRASHED = "crashed"  # the trainer is gone with a non-zero, unknown or missing exit code
    FINISHED = "finished"  # the trainer exited 0: training ran to its end; never relaunched
    UNKNOWN = "unknown"  # no launch on record and no session: nothing to judge
    STOPPED = "stopped"  # stopped on purpose (`relaunch stop`) and nothing runs: left stopped until `relaunch recover`
    PAUSED = "paused"  # alive but stopped by a signal (state T: SIGSTOP, Ctrl-Z, a debugger): a person's act, never stopped or relaunched
    UNMANAGED = (
        "unmanaged"  # the session holds what relaunch will not judge or touch (not a training run, a second trainer): a person must look
    )

    def is_fine(self) -> bool:
        """A check may end on this verdict without a person being told (the flow run ends Completed)."""
        return self in _FINE

    def needs_recovery(self) -> bool:
        """`check --recover` hands the run to recover-training; every other verdict leaves the host as it is."""
        return self in _NEEDS_RECOVERY

    def is_failure(self) -> bool:
        """A run that ran and went wrong: the same failure on many hosts may be one cause (an incident). A target
        with nothing on record (a fleet's first night) needs a launch, and is no failure, shared or not."""
        return self in _FAILURES


_FINE = frozenset({Verdict.HEALTHY, Verdict.STARTING, Verdict.FINISHED, Verdict.STOPPED, Verdict.PAUSED})
_FAILURES = frozenset({Verdict.CRASHED, Verdict.STALLED, Verdict.DEGRADED, Verdict.DIVERGED})
_NEEDS_RECOVERY = _FAILURES | {Verdict.UNKNOWN}


class Cause(str, Enum):
    FX_TRACING_RACE = "fx_tracing_race"  # a thread FX-traced while others called a compiled function
    MISSING_DEPENDENCY = "missing_dependency"  # an import failed or a library asked to `pip install` X
    CUDA_OOM = "cuda_oom"  # torch.OutOfMemoryError / CUDA out of memory on a GPU
    HOST_OOM_KILLED = "host_oom_killed"  # the kernel's OOM killer took the process (exit 137 + kernel line)
    DISTRIBUTED_FAILURE = "distributed_failure"  # a collective or rendezvous failed or timed out (NCCL, gloo, c10d, TCPStore, torchrun)
    COMPILE_ERROR = "compile_error"  # torch.compile / inductor failed to build a kernel
    KILLED = "killed"  # ended by a signal from outside (SIGTERM, SIGKILL) with no traceback
    GPU_FAULT = "gpu_fault"  # a GPU failed: kernel Xid, fallen off the bus, uncorrectable ECC, missing from nvidia-smi
    DISK_FULL = "disk_full"  # no space left: Errno 28, torch.save's write failure, or the poll's free space below the minimum
    NATIVE_CRASH = "native_crash"  # died of its own SIGSEGV/SIGBUS/SIGABRT/SIGILL/SIGFPE, a fatal Python error, a DataLoader worker's signal  # (a DataLoader worker the kernel's OOM killer took is host_oom_killed: the kernel line names the worker's PID)
    BROKEN_CHECKPOINT = "broken_checkpoint"  # died loading the checkpoint it was given: the file is damaged (truncated, corrupt archive)
    CHECKPOINT_INCOMPATIBLE = "checkpoint_incompatible"  # an intact checkpoint this torch or this code refuses: weights_only unpickling, state_dict keys or shapes
    CORRUPT_CACHE = "corrupt_cache"  # a damaged compile-cache entry the trainer loads and dies on (inductor's cached module, Triton's)
    SILENT_EXIT = "silent_exit"  # gone with no exit code, no traceback, no kernel line
    ERROR = "error"  # any other exception; the exception line says which
    NOT_A_TRAINER = "not_a_trainer"  # the target's session holds a program that is not a training run (no log it writes)
    TWO_TRAINERS = "two_trainers"  # relaunch's trainer lives outside the session while another run holds the session
    BLOCKED = (
        "blocked"  # stands still waiting on something alive outside its tree (a file lock's holder, a device in D state): never stopped
    )

    def is_infrastructure(self) -> bool:
        """The machine or its surroundings failed, not the training code: a return of it never uses up the restart
        budget across nights (relaunch/deciding/history.py), as SkyPilot keeps preemptions apart from `max_restarts_on_errors`."""
        return self in _INFRASTRUCTURE

    def knock_on_rank(self) -> int:
        """How likely a node's crash of this cause only followed a peer's (-1: a failure of its own; higher: more likely
        the knock-on): a gang's first failure is the node whose cause ranks lowest (relaunch/deciding/gang.py)."""
        return _KNOCK_ON.index(self) if self in _KNOCK_ON else -1

    def keeps_cache_aside(self) -> bool:
        """The compile cache is this failure's evidence: the warm-up keeps it aside for a person instead of removing it."""
        return self is Cause.CORRUPT_CACHE


# killed: a SIGTERM/SIGKILL from outside is a preemption or an operator. silent_exit: gone with no exit code and no
# trace, which is what a host reboot or a lost container leaves (the supervisor that records the exit died too).
# gpu_fault: the GPU ledger keeps it (a ledgered GPU is never given back), not the code budget. disk_full: the cure is
# free space, which no code change brings; the playbook escalates it while the disk stays full. Not here: distributed_failure
# and the OOMs, which the trainer's own code or configuration causes as often as the fabric does, so they count.
# corrupt_cache: a cache cut short by a full disk or a kill mid-write; the code is not at fault. checkpoint_incompatible
# is drift or a code change, and counts.
_INFRASTRUCTURE = frozenset({Cause.KILLED, Cause.SILENT_EXIT, Cause.GPU_FAULT, Cause.DISK_FULL, Cause.CORRUPT_CACHE})
# Causes a node's crash takes when it only followed a peer's, least likely to be the first failure last: a lost
# collective says so (distributed_failure), and so, as a rule, does a plain exception (gloo's "connection closed by
# peer" raised in the rank).
_KNOCK_ON = (Cause.ERROR, Cause.DISTRIBUTED_FAILURE)


class Category(str, Enum):
    PRODUCTIVE = "productive"  # the trainer printed step lines, and their steps were kept
    WASTED = "wasted_progress"  # step lines whose steps were redone: after the checkpoint the next run resumed from
    DETECTION = "detection"  # from the run's last step line to the verdict that said it was not fine
    STOP = "stop"  # stopping the run (and its leftovers, its stacks taken)
    REBUILD = "rebuild"  # venv built or rebuilt, package installed, code restored, venv rolled back
    WARM_UP = "warm_up"  # the compile cache cleared and warmed
    LAUNCH = "launch"  # the launch step itself
    RECOVERY_OTHER = "recovery_other"  # relaunch's own checks and bookkeeping between a verdict and the launch
    START_UP = "start_up"  # from the trainer's start to its first step line
    ESCALATED = "escalated"  # escalated to a person, until the next launch or healthy verdict
    NOT_RUNNING = "not_running"  # nothing ran and relaunch was not at work (or nothing says otherwise)


class Step(str, Enum):
    # Procedure order: steps_for() runs an action's steps in this order.
    PREFLIGHT = "preflight"
    STOP_LEFTOVERS = "stop_leftovers"
    CAPTURE_STACKS = "capture_stacks"
    # Before the stop: a venv that cannot be built fails the recovery while the run still runs.
    BUILD_VENV = "build_venv"
    STOP = "stop"
    REBUILD_VENV = "rebuild_venv"
    INSTALL_PACKAGE = "install_package"
    RESTORE_CODE = "restore_code"
    WARM_CACHE = "warm_cache"
    LAUNCH = "launch"
    ROLLBACK_VENV = "rollback_venv"

    @property
    def of_an_action(self) -> bool:
        """Some action runs it (Action.steps); the others (preflight, the leftovers, a rollback) have their own caller."""
        return any(self in action.steps for action in Action)

    @property
    def category(self) -> Category:
        """Where a recovery's time in this step goes in goodput (relaunch/records/goodput.py)."""
        return _STEP_CATEGORY[self]


_STEP_CATEGORY: dict[Step, Category] = {
    Step.PREFLIGHT: Category.RECOVERY_OTHER,
    Step.STOP_LEFTOVERS: Category.STOP,
    Step.CAPTURE_STACKS: Category.STOP,
    Step.STOP: Category.STOP,
    Step.BUILD_VENV: Category.REBUILD,
    Step.REBUILD_VENV: Category.REBUILD,
    Step.INSTALL_PACKAGE: Category.REBUILD,
    Step.RESTORE_CODE: Category.REBUILD,
    Step.ROLLBACK_VENV: Category.REBUILD,
    Step.WARM_CACHE: Category.WARM_UP,
    Step.LAUNCH: Category.LAUNCH,
}


class Action(str, Enum):
    NONE = "none"  # healthy or finished: change nothing
    FULL_RECOVERY = "full_recovery"  # the documented procedure: venv from lock, code, cache, launch
    INSTALL_AND_RELAUNCH = "install_and_relaunch"  # add the missing package to the venv, relaunch
    REWARM_AND_RELAUNCH = "rewarm_and_relaunch"  # known-good code, fresh warmed cache, relaunch
    REWARM_CACHE_AND_RELAUNCH = "rewarm_cache_and_relaunch"  # the damaged cache moved aside and kept, a fresh one warmed, relaunch
    RESTORE_AND_RELAUNCH_SAME = "restore_and_relaunch_same_checkpoint"  # venv to the lock, code to known_good_ref, same checkpoint
    RELAUNCH = "relaunch"  # relaunch from the newest checkpoint as is
    DUMP_AND_RELAUNCH = "dump_stacks_and_relaunch"  # keep every thread's stack, then stop and relaunch
    RELAUNCH_EARLIER = "relaunch_from_earlier_checkpoint"  # skip checkpoints the failure makes suspect, relaunch
    ESCALATE = "escalate"  # stop trying: a person must look (report says why)

    @property
    def steps(self) -> tuple[Step, ...]:
        """The steps this action runs, in procedure order (a killed recovery's unfinished steps are added by
        playbook.steps_for)."""
        return _ACTION_STEPS[self]


_ACTION_STEPS: dict[Action, tuple[Step, ...]] = {
    Action.NONE: (),
    # The new venv is built aside while the run still runs (build_venv) and renamed into place after the stop
    # (rebuild_venv): a lock that cannot be built fails the recovery with the run as it was.
    Action.FULL_RECOVERY: (Step.BUILD_VENV, Step.STOP, Step.REBUILD_VENV, Step.RESTORE_CODE, Step.WARM_CACHE, Step.LAUNCH),
    Action.INSTALL_AND_RELAUNCH: (Step.STOP, Step.INSTALL_PACKAGE, Step.LAUNCH),
    Action.REWARM_AND_RELAUNCH: (Step.STOP, Step.RESTORE_CODE, Step.WARM_CACHE, Step.LAUNCH),
    Action.REWARM_CACHE_AND_RELAUNCH: (Step.STOP, Step.WARM_CACHE, Step.LAUNCH),
    Action.RESTORE_AND_RELAUNCH_SAME: (Step.BUILD_VENV, Step.STOP, Step.REBUILD_VENV, Step.RESTORE_CODE, Step.LAUNCH),
    Action.RELAUNCH: (Step.STOP, Step.LAUNCH),
    Action.DUMP_AND_RELAUNCH: (Step.CAPTURE_STACKS, Step.STOP, Step.LAUNCH),
    Action.RELAUNCH_EARLIER: (Step.STOP, Step.LAUNCH),
    Action.ESCALATE: (),
}
