"""The signatures of failures in raw text: the tables from a log's, the kernel's and the exit's signals to the
vocabulary's causes (relaunch/vocabulary.py). Pure: regular expressions and signal numbers."""

from __future__ import annotations

import re

from relaunch.vocabulary import Cause

# The DataLoader's word that a worker died (`DataLoader worker (pid 123) is killed by signal: Killed.`, `DataLoader worker
# (pid(s) 123) exited unexpectedly`): a native crash, unless the kernel's OOM killer names that PID (then host_oom_killed;
# cpu/dataloader_worker_oom_killed.log and .dmesg).
DATALOADER_WORKER_DIED = re.compile(r"DataLoader worker \(pid\(?s?\)? ?(?P<pids>[\d, ]*)\)? (?:is killed|exited unexpectedly)")

# Inductor's generated Python module, as its code cache names it (`/tmp/cache/dq/cdqj2tk...bl2hw.py`), failing by its own
# text: the traceback's innermost frame is the module's body (`in <module>`: a line cut short, `import r`), or inductor could
# not import it at all (`Failed to import PATH`: a SyntaxError). That is a cached artefact that is damaged, not a kernel to
# rebuild (cpu/compile_cache_module_truncated.log, demo/corrupt_cache_cpu.log). Where the body only led on to a failing C++
# build (cpu/compile_error.log: the innermost frame is cpp_builder.py) it stays a compile error.
CACHED_MODULE = re.compile(
    r"File \"[^\"]*/[a-z0-9]{2}/c[a-z0-9]{50,52}\.py\", line \d+, in <module>|Failed to import \S*/[a-z0-9]{2}/c[a-z0-9]{50,52}\.py\b"
)

# Triton's compiled artefacts in the cache, failing as they load (GPU captures, H200, torch 2.11, Triton 3.6): a kernel image
# overwritten, refused by the driver while inductor loads the cached graph (gpu/cache_cubin_garbage.log); the compiled launcher
# module cut short, a SIGBUS in Triton's module loader, readable only with PYTHONFAULTHANDLER=1 (gpu/cache_so_half_faulthandler.log).
CACHED_KERNEL = re.compile(
    r"CUDA driver error: device kernel image is invalid|triton/runtime/build\.py\", line \d+,? in _load_module_from_path"
)

# Inductor's own word that a cache entry is damaged (`fx graph cache unable to load compiled graph`, a glog W line, then
# torch recompiles). Alone it is healthy (cpu/compile_cache_entries_truncated.log, gpu/cache_fxgraph_half.log); followed by a
# SIGBUS or SIGSEGV before the first step it names what the process died loading (gpu/cache_prefix_all.log).
CACHE_DAMAGE_WARNING = re.compile(r"fx graph cache unable to load compiled graph")

# An intact checkpoint that this torch or this code refuses: torch >= 2.6's weights_only unpickler meeting a pickled object
# (cpu/checkpoint_weights_only.log), load_state_dict after a code change (cpu/checkpoint_state_dict_mismatch.log).
INCOMPATIBLE_CHECKPOINT = re.compile(
    r"Weights only load failed|Error\(s\) in loading state_dict for|size mismatch for [\w.]+: copying a param|(?:Missing|Unexpected) key\(s\) in state_dict"
)

# An intact checkpoint whose pickled object names a module or class the code no longer has where the code that wrote it
# had it (a refactor moved or renamed it): the unpickler's find_class cannot import the module (`ModuleNotFoundError: No
# module named 'trainlib.config'`, cpu/checkpoint_class_moved.log) or find the class in it (`AttributeError: Can't get
# attribute 'TrainConfig' on <module 'trainlib.config' from ...>`, cpu/checkpoint_class_renamed.log). The same file loads
# with the code that wrote it (cpu/checkpoint_class_restored.log): the code changed, not the file.
PICKLED_NAME_GONE = re.compile(
    r"ModuleNotFoundError: No module named '(?P<module>[\w.]+)'|AttributeError: Can't get attribute '(?P<cls>[\w.]+)' on <module '(?P<in>[\w.]+)'"
)

# numpy's word for a write the filesystem cut short (`OSError: 100000 requested and 8176 written`, from ndarray.tofile
# under np.save, cpu/numpy_short_write.log): the disk filled mid-write, though nothing says "space".
SHORT_WRITE = re.compile(r"\b(?P<requested>\d+) requested and (?P<written>\d+) written\b")

# The lines under that error that say what exactly did not fit: the global the unpickler refused, the keys and shapes.
LOAD_ERROR_DETAIL = re.compile(r"^\s*(?:WeightsUnpickler error: |(?:Missing|Unexpected) key\(s\) in state_dict: |size mismatch for )")

# C++'s last words for an exception nothing caught (`terminate called after throwing an instance of 'gloo::EnforceNotMet'`,
# `'c10::DistBackendError'`), when the exception is the collectives': the SIGABRT that follows is that error's.
UNCAUGHT_DISTRIBUTED = re.compile(r"terminate called after throwing an instance of '(?:c10::Dist\w*Error|gloo::\w+)'")

# Rank 0's word that ranks never reached dist.monitored_barrier in its timeout (`Rank 1 failed to pass monitoredBarrier in
# 30000 ms`; with wait_all_ranks=True `Ranks 1, 2 failed to pass ...`): theirs is the failure, rank 0 only waited.
BARRIER_MISSED = r"\bRanks? \d+(?:, \d+)* failed to pass monitoredBarrier in \d+ ms"

# Log signatures, each a regex over one line. The earliest matching line in the log decides:
# knock-on failures print later than their cause.
SIGNATURES: list[tuple[Cause, re.Pattern[str]]] = [
    # Before everything else: a GPU that failed explains every CUDA error printed after it.
    (
        Cause.GPU_FAULT,
        re.compile(
            r"NVRM: Xid \(PCI:[^)]*\): (?!(?:13|31|43|45),)\d+|fallen off the bus|GPU is lost|[Uu]ncorrectable ECC error|Unable to determine the device handle for GPU"
        ),
    ),
    # torch.save on a full disk says no "space" at all: its stream error, then the writer's position check.
    (
        Cause.DISK_FULL,
        re.compile(
            r"No space left on device|\[Errno 28\]|\bENOSPC\b|PytorchStreamWriter failed writing file|basic_ios::clear: iostream error|inline_container\.cc:\d+\] \. unexpected pos"
            rf"|{SHORT_WRITE.pattern}"
        ),
    ),
    (
        Cause.NATIVE_CRASH,
        re.compile(
            rf"^Fatal Python error: |{DATALOADER_WORKER_DIED.pattern}|\b(?:Segmentation fault|Bus error|Aborted|Illegal instruction|Floating point exception) \(core dumped\)"
        ),
    ),
    (Cause.CHECKPOINT_INCOMPATIBLE, INCOMPATIBLE_CHECKPOINT),
    # A checkpoint cut short fails in torch.load in several ways (a short one: `OSError: [Errno 22] Invalid
    # argument` from the zip reader), so a failure inside torch/serialization.py counts too.
    (
        Cause.BROKEN_CHECKPOINT,
        re.compile(
            r"PytorchStreamReader failed reading zip archive|failed finding central directory|_pickle\.UnpicklingError|SafetensorError|EOFError: Ran out of input|torch/serialization\.py\", line \d+, in (?:load|_load|__init__|_open_zipfile_reader)\b"
        ),
    ),
    # The race's faces: dynamo refusing while FX traces, FX's global Module.__call__
    # patch catching another thread's forward, the patcher reset under another trace, and
    # the tracing thread itself finding the other thread's tracer (seen on CPU with torch 2.13).
    (
        Cause.FX_TRACING_RACE,
        re.compile(
            r"using FX to symbolically trace a dynamo-optimized function|CURRENT_PATCHER is None in finally block|Found multiple different tracers|fx/_symbolic_trace\.py\", line \d+, in (module_call_wrapper|call_module|path_of_module|_new_patcher)"
        ),
    ),
    (Cause.MISSING_DEPENDENCY, re.compile(r"\b(ModuleNotFoundError|ImportError)\b.*|.*\bpip install\b")),
    (Cause.CUDA_OOM, re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|CUDA error: out of memory")),
    # Ctrl-C: Python's KeyboardInterrupt, the closing line of whatever traceback it cut short (cpu/keyboard_interrupt.log).
    (Cause.KILLED, re.compile(r"^KeyboardInterrupt\s*$")),
    # torchrun's elastic agent raising the death signal it received (SIGTERM from a scheduler, a spot reclaim, a person):
    # a preemption, whatever its workers printed as they were stopped (cpu/torchrun_sigterm.log).
    (Cause.KILLED, re.compile(r"\bSignalException: Process \d+ got signal: \d+")),
    (
        Cause.DISTRIBUTED_FAILURE,
        re.compile(
            # NCCL (gpu/nccl_failure.log, gpu/nccl_watchdog_timeout.log)
            r"\bNCCL (error|WARN|INFO.*failed)|ProcessGroupNCCL|ncclInternalError|ncclUnhandledCudaError|ncclSystemError|ncclInvalidUsage|Watchdog caught collective operation timeout|DistBackendError"
            # torch's store and network errors: rank 0 waiting for ranks that never join, a rank that cannot reach rank 0
            # (cpu/tcpstore_rank_never_joins.log, cpu/tcpstore_no_master.log, cpu/rendezvous_timeout_static.log)
            r"|\bDistStoreError\b|\bDistNetworkError\b"
            # torchrun's c10d rendezvous past its join_timeout (cpu/rendezvous_timeout_c10d.log)
            r"|\bRendezvous(?:Timeout|Closed|Connection|State)?Error\b"
            # gloo: a peer lost mid-collective (cpu/gloo_peer_lost.log, cpu/gloo_peer_lost_torchrun.log; `Read error ...:
            # Connection reset by peer`, cpu/collective_mismatch_rank1.log), a mesh that cannot form
            r"|gloo/transport/tcp/\w+\.cc:\d+\] (?:(?:Read|Write) error [^:]*:\d+: )?(?:Connection closed by peer|Connection reset by peer|Broken pipe|Timed out waiting|timed out connecting)|Gloo connectFullMesh failed"
            # A distributed error no Python code caught: C++'s terminate names its type (then SIGABRT: the abort is this
            # error's consequence, not a native crash), and the collectives' own word for ranks that disagree
            # (cpu/collective_mismatch.log, cpu/collective_mismatch_torchrun.log, gpu/nccl_watchdog_timeout.log)
            rf"|{UNCAUGHT_DISTRIBUTED.pattern}|distributed collective mismatch|\[enforce fail at [^\]]*/gloo/"
            # A monitored barrier some rank never reached (cpu/monitored_barrier_*.log): the failure is that rank's.
            rf"|{BARRIER_MISSED}"
        ),
    ),
    (
        Cause.COMPILE_ERROR,
        re.compile(r"BackendCompilerFailed|InductorError|CppCompileError|torch\._inductor\.exc|torch\._dynamo\.exc\.(?!Unsupported)"),
    ),
]

# A matched line's cause narrowed by the traceback's own message (the matching line to the closing exception line and the
# lines it chains): a frame in torch.load whose error is the weights_only unpickler's refusal is an intact checkpoint
# (cpu/checkpoint_weights_only.log); a BackendCompilerFailed that chains `Failed to import` a cached module is a damaged
# cache, not a compiler to fix (cpu/compile_cache_module_truncated.log). The traceback's innermost frame counts as message,
# and a dump with no exception line (faulthandler's, after `Fatal Python error:`) counts whole.
REFINEMENTS: dict[Cause, list[tuple[Cause, re.Pattern[str]]]] = {
    Cause.BROKEN_CHECKPOINT: [(Cause.CHECKPOINT_INCOMPATIBLE, INCOMPATIBLE_CHECKPOINT), (Cause.CHECKPOINT_INCOMPATIBLE, PICKLED_NAME_GONE)],
    Cause.COMPILE_ERROR: [(Cause.CORRUPT_CACHE, CACHED_MODULE), (Cause.CORRUPT_CACHE, CACHED_KERNEL)],
    # faulthandler's dump of a native crash: the thread that crashed was loading Triton's cached module.
    Cause.NATIVE_CRASH: [(Cause.CORRUPT_CACHE, CACHED_KERNEL)],
}

# A traceback's closing line: `module.Error: message` at column 0.
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)\b(?::.*)?$")

# Exceptions that only carry a worker's failure up to the launcher (mp.spawn, torchrun).
WRAPPER_EXCEPTIONS = re.compile(r"ProcessRaisedException|ProcessExitedException|ChildFailedError|Caught \w+ in DataLoader worker process")

# A rank's failure that is a peer's knock-on: the collective lost the rank at the other end (its socket closed or reset,
# a pipe broken, a mesh that cannot form, a collective or store that timed out waiting). Beside a rank that failed by
# itself (its own exception, its own native signal), these never name the root cause (cpu/rank_error_torchrun.log).
PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|Connection refused|timed out connecting|Timed out waiting"
    r"|Watchdog caught collective operation timeout|collective operation timeout|due to a collective timeout|failure detected by watchdog"
    r"|Gloo connectFullMesh failed|\bDistNetworkError\b|\bDistStoreError\b|NCCL communicator was aborted|remote process exited"
    rf"|{BARRIER_MISSED}"
)

# Signals that come from outside the process: a person's Ctrl-C (SIGINT), a terminal that closed (SIGHUP), a scheduler's
# or a person's SIGTERM. A death by one is `killed`, whatever traceback the process printed as it went.
OUTSIDE_SIGNALS = frozenset({1, 2, 15})

# Warnings that explain a slow run.
SLOWDOWN_WARNINGS = re.compile(
    r"called without torch\.compile|falling back to .*(eager|uncompiled|slow)|Graph break|recompil", re.IGNORECASE
)

# Kernel log lines of the OOM killer, each naming the PID it killed (the `oom-kill:` summary line as `pid=N,`).
# The PID decides whose kill it was: a host's kernel log holds other jobs' kills too (other containers' cgroups).
KERNEL_OOM = re.compile(
    r"Out of memory: Killed process (?P<pid>\d+)|oom-kill:.*\bpid=(?P<pid4>\d+),|oom_reaper: reaped process (?P<pid2>\d+)|Memory cgroup out of memory: Killed process (?P<pid3>\d+)"
)

# Import names whose distribution is called something else.
MODULE_TO_PACKAGE: dict[str, str] = {
    "sklearn": "scikit-learn",
    "cv2": "opencv-python",
    "PIL": "Pillow",
    "yaml": "PyYAML",
    "bs4": "beautifulsoup4",
    "google.protobuf": "protobuf",
    "attr": "attrs",
    "dateutil": "python-dateutil",
    "Crypto": "pycryptodome",
    "flash_attn": "flash-attn",
    "sentencepiece": "sentencepiece",
}

SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}

# Signals a process raises on itself when its native code fails: not a kill from outside.
NATIVE_SIGNALS = frozenset({4, 6, 7, 8, 11})

# The training loss as trainers print it: `loss=nan`, `loss nan`, `loss: inf`, `'loss': -inf`, `loss=3.64`,
# `train_loss=3.6`, Megatron's `lm loss: 3.456789E+00`, `lm_loss`, Lightning's `train_loss_step`.
# Other losses are not the loss: `z_loss`, `aux_loss`, `load_balancing_loss`, `moe/balance_loss`, `val_loss`, `eval_loss`
# (a word joined to `loss` by `_`, `/`, `.` or `-`), nor `aux loss:` (a word and a space before `loss`), unless the
# word is one that names the training loss itself (train, lm, avg, ...). A z_loss of nan beside loss=2.6 is no divergence.
_LOSS_NAMES = r"(?:train(?:ing)?|lm|avg|mean|average|running|smoothed|reduced)"
# Words that, a space before `loss`, name another loss (`aux loss: nan`, Megatron's `mtp_1 loss:`); one lookbehind each.
_OTHER_LOSSES = "".join(
    rf"(?<!{word} )"
    for word in (
        r"\baux",
        r"\bz",
        "moe",
        "router",
        "balance",
        "balancing",
        r"\bval",
        "valid",
        "validation",
        "eval",
        "test",
        r"\bkl",
        "mtp_\\d",
        "distill",
    )
)
DEFAULT_LOSS = re.compile(
    rf"""(?:(?<![\w./-]){_LOSS_NAMES}[ _/]|(?<![\w./-]){_OTHER_LOSSES})loss(?:_step|_epoch)?(?![\w./-])['"]?\s*[=:]?\s*(?P<value>[-+]?(?:nan|inf(?:inity)?|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+))""",
    re.IGNORECASE,
)

# A step mention that reports no training step: it is governed, in its own clause, by a resume, load, save or eval verb
# or noun (`resuming from /ckpt/step_100.pt at step 100`, `loaded checkpoint at step=100`, `saved checkpoint step_200 at
# step 200`, HF's `Continuing training from global step 500`, torchtitan's `Loading the checkpoint at step 100`,
# `Restored from global step 100`, `Evaluating at step 500`, `skipping first 500 batches`, a restart, warm start,
# fast-forward, rewind, roll-back or recovery `to step 600`), or it lies inside a path
# (Lightning's `Restored all states from the checkpoint at /ckpt/epoch=1-step=80.ckpt`). The default step pattern
# (`step[=: ]N`) matches them all; counted as steps they ended the start-up grace of a run that then compiled for
# minutes after its resume, and it was called stalled and killed. The rule is relaunch.judging.logtext.training_step_mention:
# a clause ends at `|`, `;`, `•` or a sentence's full stop; a governing word before the mention in its clause decides,
# and after it only the words of GOVERNS_AFTER (`step 200: checkpoint saved`), so that `step=12 val loss 2.1` and
# `step=12 eval_loss=2.1` stay training steps. A word that is a metric's key (`eval_loss`, `val/loss`, `saving=False`,
# `eval: 2.31`) governs nothing.
NOT_A_TRAINING_STEP = re.compile(
    r"(?<![\w/.-])(?:"
    r"resum(?:e|ed|es|ing|ption)|restor(?:e|ed|es|ing|ation)|(?:re)?load(?:s|ed|ing)?|sav(?:e|ed|es|ing)"
    r"|writ(?:e|es|ing|ten)|wrote|checkpoint(?:s|ed|ing)?|ckpts?|snapshot(?:s|ted|ting)?"
    r"|eval(?:s|uat(?:e|ed|es|ing|ion))?|validat(?:e|ed|es|ing|ion)|val|test(?:ing)?|predict(?:s|ed|ing|ion)?|sanity"
    r"|skip(?:s|ped|ping)?|continu(?:e|es|ed|ing)|export(?:s|ed|ing)?|upload(?:s|ed|ing)?"
    r"|(?:re)?start(?:s|ed|ing)?\s+(?:at|from)|from\s+(?:global[ _])?(?:step|iter(?:ation)?)"
    r"|restart(?:s|ed|ing)?|warm[\s_-]?start(?:s|ed|ing)?|fast[\s_-]?forward(?:s|ed|ing)?|rewind(?:s|ing)?|rewound"
    r"|roll(?:s|ed|ing)?\s+back|rollback|recover(?:s|ed|ing|y)?|pick(?:s|ed|ing)?\s+up"
    r")(?![\w/.-]|\s*=|\s*:\s*[-+]?\.?\d)",
    re.IGNORECASE,
)
# Governing words that may follow the mention in its clause (`step 200: checkpoint saved`, `step 500 evaluating`):
# verbs and nouns of the event, not the nouns of a metric printed beside a training step (`val loss`, `test acc`).
GOVERNS_AFTER = re.compile(
    r"^(?:resum|restor|reload|loaded|loading|saved|saving|writ|wrote|checkpoint|ckpt|snapshot|evaluat|validating|skip|export|upload)",
    re.IGNORECASE,
)
# Where a clause ends: a pipe, a semicolon, rich's `•`, a sentence's full stop (not a decimal point: `loss 2.31`).
CLAUSE_BREAK = re.compile(r"[|;•]|(?<=[^\d\s])\.(?=\s)|(?<=\d)\.(?=\s+[A-Z])")
# A mention inside a path or a file name is a checkpoint's name, not a step: `/ckpt/step_100.pt`, `epoch=1-step=80.ckpt`.
PATH_TOKEN = re.compile(r"\.(?:pt|pth|ckpt|safetensors|bin|pkl|tar|distcp|json)\b|^[~.]?/|/.*/|ckpt|checkpoint", re.IGNORECASE)

# Step lines the default step pattern does not see, read under it too (a pattern a user gave says exactly which
# lines are steps): `Step 12/1000`, `[step 12]`, `global_step: 12`, `iteration 12`, `iter: 12`, `it 12/1000`, and a
# count printed with thousands separators (`iter: 10,100`).
STEP_LINE = re.compile(
    r"(?<![\w/.-])(?:global[_ ])?step(?:=|:\s*|\s+)(?P<step>\d{1,3}(?:,\d{3})+(?![\d.]|,\d)|\d+(?![\d.]|,\d))"
    r"|(?<![\w/.-])iter(?:ation)?(?:=|:\s*|\s+)(?P<step2>\d{1,3}(?:,\d{3})+(?![\d.]|,\d)|\d+(?![\d.]|,\d))"
    r"|(?:^|(?<=[\[(|]))\s*it(?:=|:\s*|\s+)(?P<step3>\d+)(?![\d.]|,\d)"
    r"|(?<![\w/.-])it\s+(?P<step4>\d+)\s*/\s*\d+",
    re.IGNORECASE,
)

# tqdm's progress line, as clean_lines splits its `\r` redraws: `  12%|█▏        | 120/1000 [00:30<03:40,  4.00it/s]`
# (a total known), Lightning's `Epoch 3:  45%|████▌     | 450/1000 [02:33<03:07, 2.93it/s, v_num=0, train_loss=2.31]`,
# a total unknown (tqdm's total=inf, as Lightning resumed over an iterable draws it: `Training: |          | 41/? [00:00<00:00,
# 3531.21it/s]`) or none (`120it [00:30,  4.00it/s]`); rich's (Lightning's RichProgressBar: `Epoch 1/1  ━━━━━━━━ 40/40
# 0:00:00 • 0:00:00 287.88it/s`). `n` is the count of finished iterations; what comes before the match is its description.
TQDM_PROGRESS = re.compile(
    r"(?:\d{1,3}%)?\|[^|\n]*\|\s*(?P<n>\d+)/(?:\d+|\?) \[(?:\d+:)?\d{2}:\d{2}<"  # `12%|█▏  | 120/1000 [00:30<03:40, ...`
    r"|(?<![\w.])(?P<n2>\d+)[A-Za-z ]{0,12} \[(?:\d+:)?\d{2}:\d{2},\s+(?:\?|\d)"  # `120it [00:30,  4.00it/s]`
    r"|[\u2500-\u257f]\s*(?P<n3>\d+)/(?:-?\d+|\?)\s+(?:\d+:)?\d{1,2}:\d{2}\s+•"  # `━━━━╸━━ 450/1000 0:02:33 • 0:03:07`
)

# A tqdm bar's description that says it is not training: start-up's loading and data preparation, a resume's skipping of
# batches seen (HF's `Skipping the first batches`), evaluation (Lightning's `Validation DataLoader 0:`, `Sanity Checking`).
NOT_TRAINING_PROGRESS = re.compile(
    r"\b(?:load|resum|restor|skip|download|fetch|map|filter|tokeni[sz]|preprocess|generat|extract|resolv|sav|writ|upload|convert|build|prepar|index|shuffl|pack|eval|valid|test|predict|sanity|infer|sampl|cach|warm|compil)\w*",
    re.IGNORECASE,
)
