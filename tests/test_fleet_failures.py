"""Failures a fleet sees, each injected for real and recovered end to end on this machine: a GPU that
failed (kernel Xid lines, CUDA errors), a full disk, a hung trainer, a checkpoint that does not load,
a loss that diverged, a native crash. Every test is a row of docs/fault-matrix.md.

What cannot happen here happens through real public text: the kernel's Xid lines and the CUDA errors
are public captures (tests/fixtures/logs/xid/PROVENANCE.md), printed by a `dmesg` and a `nvidia-smi`
stand-in first on PATH. Everything else is real: torch writes and truncates checkpoints, a tmpfs fills,
threads deadlock, a loss overflows, a NULL pointer is read.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from relaunch.config import Target, Thresholds
from relaunch.flows.recover import recover_training
from relaunch.judging.diagnosis import diagnose
from relaunch.judging.hardware import human_size
from relaunch.plans.launch import skipped_path
from relaunch.records.report import Report
from relaunch.tasks.health import collect_snapshot
from relaunch.tasks.launch import launch
from relaunch.tasks.stop import stop
from relaunch.testing.faults import LOST, MID_STEP, bin_without, case, live_trainers, making, reap, sha256, tmpfs, tree, wait_for
from relaunch.testing.sshd import cannot_run_here
from relaunch.testing.targets import runs, step_detail, wait_for_exit
from relaunch.vocabulary import Action, Cause, Verdict

pytestmark = pytest.mark.usefixtures("prefect_harness")

XID = Path(__file__).parent / "fixtures" / "logs" / "xid"
# The test's own interpreter has torch; the targets' venvs (tiny wheels only) do not.
TORCH_PYTHON = sys.executable

FAST = Thresholds(
    startup_grace_seconds=30, poll_interval_seconds=0.3, settle_timeout_seconds=60, healthy_steps=3, stall_window_floor_seconds=3
)

# ---------------------------------------------------------------------------------------------
# Trainers

# A few step lines, then what a process on a failed GPU prints ($1: a public capture), then exit 1.
GPU_TRAINER = """#!/usr/bin/env bash
for i in 1 2 3; do echo "step=$i loss=3.6441 acc=0.097 lr=3.96e-04 | dft=0.50b/s (20.0Ktok/s)"; done
cat -- "$1"
exit 1
"""

# Saves a torch checkpoint every 5 steps into $1 until the disk is full for real.
DISK_FILLING_TRAINER = """
import os, sys, torch
out = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Linear(256, 256)  # ~257 KiB of fp32 per checkpoint
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 256), torch.randn(32, 256)
for step in range(1, 1000):
    loss = (model(x) - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step={step} loss={loss.item():.4f}", flush=True)
    if step % 5 == 0:
        path = os.path.join(out, f"step_{step}.pt")
        print(f"saving checkpoint to {path}", flush=True)
        torch.save({"model": model.state_dict(), "step": step}, path)
"""

# Steps, then two threads take two locks in opposite orders: a real deadlock. The interleaving is
# forced (a barrier) on the first run only, the way a rare race happens once; $1 records that it did.
HUNG_TRAINER = """
import pathlib, sys, threading, time
once = pathlib.Path(sys.argv[1])
a, b = threading.Lock(), threading.Lock()
both_hold_one = threading.Barrier(2)


def fetch_batch():  # the loader thread: a, then b
    with a:
        both_hold_one.wait()
        with b:
            pass


def all_reduce_grads():  # the main thread: b, then a
    with b:
        both_hold_one.wait()
        with a:
            pass


for step in range(1, 1_000_000):
    print(f"step={step} loss=3.6441", flush=True)
    time.sleep(0.05)
    if step == 5 and not once.exists():
        once.touch()
        threading.Thread(target=fetch_batch, name="loader", daemon=True).start()
        all_reduce_grads()
"""

# Resumes from the checkpoint it is given (`--resume PATH`, torch.load) before its first step line.
RESUMING_TRAINER = """
import sys, time, torch
model = torch.nn.Linear(512, 512)
start = 0
if sys.argv[1:2] == ["--resume"]:
    print(f"resuming from {sys.argv[2]}", flush=True)
    ckpt = torch.load(sys.argv[2], map_location="cpu")
    model.load_state_dict(ckpt["model"])
    start = ckpt["step"]
x = torch.randn(8, 512)
for step in range(start + 1, start + 1_000_000):
    print(f"step={step} loss={model(x).pow(2).mean().item():.4f}", flush=True)
    time.sleep(0.1)
"""

# A real loss from a tiny model; its learning-rate schedule jumps at step 25 (lr_at is a function of the
# step, so a resume from before 25 meets the same jump). Checkpoints every 10 steps into $1.
DIVERGING_TRAINER = """
import os, sys, time, torch
ckpt_dir = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
x = torch.randn(64, 8)
y = x.sum(dim=1, keepdim=True)
start = 0
if sys.argv[2:3] == ["--resume"]:
    print(f"resuming from {sys.argv[3]}", flush=True)
    ckpt = torch.load(sys.argv[3])
    model.load_state_dict(ckpt["model"])
    start = ckpt["step"]


def lr_at(step):
    return 0.01 if step < 25 else 1e12


opt = torch.optim.SGD(model.parameters(), lr=lr_at(start + 1))
for step in range(start + 1, 1_000_000):
    for group in opt.param_groups:
        group["lr"] = lr_at(step)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step={step} loss={loss.item():.4f} lr={lr_at(step):g}", flush=True)
    if step % 10 == 0:
        torch.save({"model": model.state_dict(), "step": step}, os.path.join(ckpt_dir, f"step_{step}.pt"))
    time.sleep(0.1)
"""

# Five steps (a checkpoint file per step into $1), then a native read of address 0: a real SIGSEGV.
SEGFAULT_TRAINER = """
import ctypes, pathlib, sys, time
ckpt_dir = pathlib.Path(sys.argv[1])
start = int(pathlib.Path(sys.argv[3]).read_text()) if sys.argv[2:3] == ["--resume"] else 0
for step in range(start + 1, start + 6):
    print(f"step={step} loss=2.0978", flush=True)
    (ckpt_dir / f"step_{step}").write_text(f"{step}\\n")
    time.sleep(0.05)


def fused_update(ptr):  # the "extension" call that goes wrong
    return ctypes.string_at(ptr)  # strlen() on the pointer: reads it


fused_update(0)
"""

# ---------------------------------------------------------------------------------------------
# Host commands the poll runs, first on PATH

# The fixture's kernel messages as dmesg prints them now: each message stamped with this call's uptime
# (so the poll counts it as since the launch) in place of its journal prefix or old stamp; a
# continuation line (no stamp of its own) printed as it is, as dmesg prints one.
DMESG = """#!/usr/bin/env bash
read -r up _ < /proc/uptime
exec awk -v up="$up" '
  /^[[:space:]]/ { print; next }
  { sub(/^.* kernel: /, ""); sub(/^\\[ *[0-9.]+\\] /, ""); printf "[%12.6f] %s\\n", up, $0 }' {fixture}
"""

# The real dmesg, run as an unprivileged user on a host with kernel.dmesg_restrict=1: it fails for real.
UNREADABLE_DMESG = """#!/usr/bin/env bash
exec setpriv --reuid=65534 --regid=65534 --clear-groups {dmesg} "$@"
"""

# The rows an H200 printed for the queries relaunch makes (captured, see PROVENANCE.md).
NVIDIA_SMI = """#!/usr/bin/env bash
case "$*" in
  *--query-gpu=index,memory.used,utilization.gpu*) exec cat -- {xid}/nvidia_smi_gpu_query.txt ;;
  *--query-gpu=index,pci.bus_id,*) exec cat -- {xid}/nvidia_smi_gpu_health.txt ;;
  *--query-compute-apps=pid*) exec cat -- {xid}/nvidia_smi_compute_apps.txt ;;
esac
echo "nvidia-smi stand-in: no capture for: $*" >&2
exit 2
"""


def dmesg_printing(fixture: Path) -> str:
    return DMESG.replace("{fixture}", shlex.quote(str(fixture)))


def host_commands(folder: Path, monkeypatch: pytest.MonkeyPatch, dmesg: str, nvidia_smi: bool) -> None:
    """Put a `dmesg` (and a `nvidia-smi`) first on the PATH relaunch runs host commands with; tmux, git, uv stay."""
    folder.mkdir(parents=True)
    scripts = {"dmesg": dmesg, **({"nvidia-smi": NVIDIA_SMI.replace("{xid}", shlex.quote(str(XID)))} if nvidia_smi else {})}
    for name, text in scripts.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    assert all(shutil.which(tool) for tool in ("tmux", "git", "uv")), "tmux, git and uv still resolve"


# ---------------------------------------------------------------------------------------------
# Set-up helpers


@pytest.fixture
def made(tmp_path):
    """Targets on this machine with a venv in place (nothing left to redo); every trainer stopped afterwards, even on failure."""
    with making(tmp_path, after=with_venv, thresholds=FAST) as make:
        yield make


def with_venv(t: Target) -> None:
    subprocess.run(["uv", "venv", "-q", "--python", t.python, t.venv_dir], check=True)


def trainer(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / "trainers" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def recover(target: Target, **kwargs) -> Report:
    """The flow's report whether it ends Completed or (escalating) Failed."""
    state = recover_training(target, return_state=True, **kwargs)
    report = state.result(raise_on_failure=False)
    assert isinstance(report, Report), f"the flow ended {state.type} without a report: {report!r}"
    return report


def run_log(target: Target, run_id: str) -> str:
    return Path((Path(target.state_path) / "runs" / run_id / "log_path").read_text().strip()).read_text()


def told(report: Report) -> str:
    return "\n".join(
        [
            *report.timeline(),
            *(f"  evidence {a.number}: {line}" for a in report.attempts for line in a.evidence),
            f"  message: {report.message}",
        ]
    )


def launched_and_exited(target: Target) -> None:
    launch.fn(target, 1)
    wait_for_exit(target, 60)


def polled_verdict(target: Target) -> Verdict:
    """One real poll of the host (long-polled), judged as a fresh recovery would judge it."""
    return diagnose(collect_snapshot(target, wait_seconds=0.5), target.thresholds, min_free_disk_gb=target.min_free_disk_gb).verdict


# ---------------------------------------------------------------------------------------------
# 1. A GPU that failed is never relaunched onto

GPU0 = "GPU 0 (PCI 00000000:00:06.0)"


@case(
    MID_STEP,
    "a GPU fails under the trainer: the kernel logs Xid 79 (fallen off the bus) or Xid 48 (double-bit ECC) then 64 (public captures, printed by a `dmesg` stand-in), nvidia-smi lists the GPU (captured H200 rows), the trainer dies with the CUDA error such a GPU gives (`unspecified launch failure`, `uncorrectable ECC error encountered`)",
    "crashed / gpu_fault, escalated, never relaunched (one launch); the evidence names GPU 0, its PCI bus id, the Xid and its meaning, and the kernel line",
)
@pytest.mark.parametrize(
    "kernel, trainer_output, expected",
    [
        ("xid79_journal.txt", "cuda_unspecified_launch_failure.log", [f"{GPU0}: Xid 79: GPU has fallen off the bus"]),
        (
            "xid48_journal.txt",
            "cuda_ecc_trainer.log",
            [
                f"{GPU0}: Xid 48: double-bit ECC error: uncorrectable memory error",
                f"{GPU0}: Xid 64: ECC page retirement or row remapping failed: the GPU needs service",
            ],
        ),
    ],
    ids=["xid79", "xid48"],
)
def test_a_gpu_that_failed_with_an_xid_is_escalated_and_never_relaunched_onto(
    made, tmp_path, monkeypatch, kernel, trainer_output, expected
):
    host_commands(tmp_path / "bin", monkeypatch, dmesg_printing(XID / kernel), nvidia_smi=True)
    t = made(launch_command=f"bash {trainer(tmp_path, 'gpu_trainer.sh', GPU_TRAINER)} {XID / trainer_output}")
    launched_and_exited(t)
    report = recover(t)
    first = report.attempts[0]
    assert (first.verdict, first.cause, first.action) == (Verdict.CRASHED, Cause.GPU_FAULT, Action.ESCALATE), told(report)
    for line in expected:
        assert line in first.evidence, told(report)
    number = expected[0].split("Xid ")[1].split(":")[0]
    assert any(re.search(rf"^\[ *[0-9.]+\] NVRM: Xid \(PCI:0000:00:06\): {number},", e) for e in first.evidence), (
        "the kernel's own line is quoted"
    )
    assert first.summary == expected[0] and not report.ok and len(report.attempts) == 1
    assert len(runs(t)) == 1, f"one launch, never a relaunch onto the failed GPU: {runs(t)}"
    assert live_trainers(t) == []


@case(
    MID_STEP,
    "a GPU that fell off the bus, said by a newer driver over three dmesg lines with no Xid (NVSentinel#155: the continuation lines carry no `[stamp]`); the trainer dies with `CUDA error: unspecified launch failure`",
    "crashed / gpu_fault from the kernel's `fallen off the bus`, escalated, one launch",
)
def test_a_gpu_that_fell_off_the_bus_said_over_several_dmesg_lines_is_never_relaunched_onto(made, tmp_path, monkeypatch):
    # No nvidia-smi stand-in: the kernel log is the only witness, as on a host where nvidia-smi hangs on the lost GPU.
    host_commands(tmp_path / "bin", monkeypatch, dmesg_printing(XID / "fallen_off_bus_multiline.txt"), nvidia_smi=False)
    t = made(launch_command=f"bash {trainer(tmp_path, 'gpu_trainer.sh', GPU_TRAINER)} {XID / 'cuda_unspecified_launch_failure.log'}")
    launched_and_exited(t)
    kernel = collect_snapshot(t).kernel_lines
    report = recover(t)
    first = report.attempts[0]
    assert (first.verdict, first.cause, first.action) == (Verdict.CRASHED, Cause.GPU_FAULT, Action.ESCALATE), (
        "BUG relaunch/host/snapshot.sh (kernel section): the time filter "
        '`awk \'{ t = $0; sub(/^\\[ */, "", t); split(t, a, "]"); if (a[1] + 0 >= since) print }\'` reads a dmesg '
        "continuation line (no [stamp], only indentation) as time 0 and drops it, so the multi-line 'fallen off the bus' "
        f"never reaches the diagnosis (kernel lines the poll sent: {kernel}) and the run is relaunched onto the lost GPU:\n{told(report)}"
    )
    assert any("fallen off the bus" in e for e in first.evidence), told(report)
    assert len(runs(t)) == 1, f"one launch, never a relaunch onto the lost GPU: {runs(t)}"


@case(
    MID_STEP,
    "a GPU fault where the kernel log cannot be read (the real `dmesg` run unprivileged under `kernel.dmesg_restrict=1`: `dmesg: read kernel buffer failed: Operation not permitted`, exit 1); the trainer prints `CUDA error: uncorrectable ECC error encountered` (public capture)",
    "crashed / gpu_fault from the trainer's own line, escalated, one launch; the evidence says the kernel log is not readable",
)
def test_a_gpu_fault_with_an_unreadable_kernel_log_is_judged_from_the_trainers_cuda_error_and_says_so(made, tmp_path, monkeypatch):
    real_dmesg = shutil.which("dmesg")
    if not real_dmesg or not shutil.which("setpriv") or Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
        cannot_run_here("needs dmesg, setpriv and kernel.dmesg_restrict=1 to make the kernel log unreadable for real")
    host_commands(tmp_path / "bin", monkeypatch, UNREADABLE_DMESG.format(dmesg=real_dmesg), nvidia_smi=True)
    denied = subprocess.run(["dmesg"], capture_output=True, text=True)
    assert (denied.returncode, denied.stdout + denied.stderr) == (1, (XID / "dmesg_not_permitted.txt").read_text()), (
        "the stand-in fails as util-linux does"
    )
    t = made(launch_command=f"bash {trainer(tmp_path, 'gpu_trainer.sh', GPU_TRAINER)} {XID / 'cuda_ecc_trainer.log'}")
    launched_and_exited(t)
    assert collect_snapshot(t).kernel_readable is False
    report = recover(t)
    first = report.attempts[0]
    assert (first.verdict, first.cause, first.action) == (Verdict.CRASHED, Cause.GPU_FAULT, Action.ESCALATE), told(report)
    assert "RuntimeError: CUDA error: uncorrectable ECC error encountered" in first.evidence, told(report)
    assert len(runs(t)) == 1, f"one launch, never a relaunch onto the failed GPU: {runs(t)}"
    assert any("kernel log is not readable" in e for e in first.evidence), (
        "BUG relaunch/judging/gone.py: the note 'the kernel log is not readable here ...' (kernel_note) is added only in "
        "_hardware, i.e. only when kernel or nvidia-smi evidence was found; when the GPU fault is judged from the trainer's "
        "own lines in judge_gone (exactly the case where the kernel log could not be read) the note is left out, so the report "
        f"reads as if the kernel had been checked and was clean:\n{told(report)}"
    )


# ---------------------------------------------------------------------------------------------
# 2. A full disk is never relaunched into


@case(
    LOST,
    "checkpoint_dir on a real 1 MiB tmpfs; the trainer's `torch.save` fills it and fails for real; `min_free_disk_gb` above what is left",
    "crashed / disk_full, escalated with the free-space figures and the folder; one launch; every file in checkpoint_dir (the partial one too) identical after the recovery",
)
def test_a_disk_that_filled_under_the_trainer_is_escalated_and_its_checkpoints_are_untouched(made, tmp_path):
    with tmpfs(tmp_path / "small", "1m") as small:
        t = made(
            launch_command=f"{TORCH_PYTHON} {trainer(tmp_path, 'fill.py', DISK_FILLING_TRAINER)} {small}",
            checkpoint_dir=str(small),
            min_free_disk_gb=0.0005,
        )
        try:
            launched_and_exited(t)
            (run,) = runs(t)
            assert re.search(r"No space left on device|basic_ios::clear: iostream error|PytorchStreamWriter failed", run_log(t, run)), (
                "torch.save failed for real"
            )
            before = tree(small)
            assert len(before) >= 2, before
            report = recover(t)
            first = report.attempts[0]
            assert (first.verdict, first.cause, first.action) == (Verdict.CRASHED, Cause.DISK_FULL, Action.ESCALATE), told(report)
            free = os.statvfs(small)
            assert free.f_bavail * free.f_frsize < 0.0005e9
            assert first.evidence[0].startswith(f"only {human_size(free.f_bavail * free.f_frsize)} free of "), told(report)
            assert f"at {small} (minimum 0.0005 GB)" in first.evidence[0], told(report)
            assert runs(t) == [run], "never relaunched into the full disk"
            assert tree(small) == before, "no checkpoint touched, the partial one included"
        finally:
            stop.fn(t)
            reap(t)


# ---------------------------------------------------------------------------------------------
# 3. A hung trainer: its stacks are kept before the stop


def wheelhouse_or_skip() -> str:
    from relaunch.demo.target import wheelhouse

    try:
        path = wheelhouse()
    except SystemExit as exc:
        cannot_run_here(str(exc))
    if not list(path.glob("py_spy-*.whl")):
        cannot_run_here(f"no py-spy wheel in {path}: run `make setup`")
    return str(path)


def deadlocked(made, tmp_path, find_links: list[str] | None = None) -> tuple[Target, tuple[str, int]]:
    """A launched trainer that has deadlocked, and long enough ago that a poll calls it stalled."""
    t = made(launch_command=f"{TORCH_PYTHON} {trainer(tmp_path, 'hung.py', HUNG_TRAINER)} {tmp_path / 'race-happened'}")
    if find_links:
        t.find_links = [*t.find_links, *find_links]
    launch.fn(t, 1)
    wait_for(lambda: polled_verdict(t) is Verdict.STALLED, 60, "the deadlocked trainer to look stalled to a poll")
    (hung_run,) = live_trainers(t)
    return t, hung_run


@case(
    LOST,
    "a Python trainer deadlocked for real (two threads, two locks, opposite orders) after 5 step lines; py-spy in the project wheelhouse (offline)",
    "stalled -> every thread's stack kept as `STATE/stacks/STAMP.txt` (py-spy, before the stop); the report names the blocked functions and says host-side (no GPUs); then stop and relaunch, healthy",
)
def test_a_hung_trainer_has_its_stacks_kept_before_it_is_stopped_and_relaunched(made, tmp_path):
    t, hung_run = deadlocked(made, tmp_path, find_links=[wheelhouse_or_skip()])
    report = recover(t)
    first = report.attempts[0]
    assert (first.verdict, first.action) == (Verdict.STALLED, Action.DUMP_AND_RELAUNCH), told(report)
    assert [s.step for s in first.steps] == ["capture_stacks", "stop", "launch"], told(report)
    stacks = step_detail(report, "capture_stacks")
    assert "skipped" not in stacks, stacks
    path = Path(stacks.stacks_file)
    assert path.parent == Path(t.state_path) / "stacks" and path.is_file(), stacks
    dump = path.read_text()
    assert f"py-spy dump --pid {hung_run[1]}" in dump and "fetch_batch" in dump and "all_reduce_grads" in dump, dump
    frames = stacks.top_frames
    assert any(line.startswith("loader ") and "fetch_batch (hung.py:" in line for line in frames), frames
    assert any(line.startswith("MainThread ") and "all_reduce_grads (hung.py:" in line for line in frames), frames
    assert "host-side" in stacks.gpus, stacks.gpus
    assert report.verdict is Verdict.HEALTHY and len(runs(t)) == 2, told(report)
    assert hung_run not in live_trainers(t) and len(live_trainers(t)) == 1


@case(
    MID_STEP,
    "a deadlocked trainer on a host where py-spy cannot be installed (offline, not in `find_links`)",
    "the report says why in `skipped` (uv's own error); the hung run is stopped and relaunched all the same: healthy",
)
def test_a_hung_trainer_is_stopped_and_relaunched_even_when_py_spy_cannot_be_installed(made, tmp_path, monkeypatch):
    # No py-spy on the host (the test venv has one): every other command stays on PATH.
    monkeypatch.setenv("PATH", str(bin_without(tmp_path / "bin", "py-spy")))
    t, hung_run = deadlocked(made, tmp_path)
    report = recover(t)
    first = report.attempts[0]
    assert (first.verdict, first.action) == (Verdict.STALLED, Action.DUMP_AND_RELAUNCH), told(report)
    stacks = step_detail(report, "capture_stacks")
    assert (stacks.skipped or "").startswith("cannot install py-spy:") and "py-spy" in stacks.skipped[len("cannot install py-spy:") :], (
        stacks
    )
    assert not stacks.stacks_file and not list((Path(t.state_path) / "stacks").glob("*")), stacks
    assert [s.step for s in first.steps] == ["capture_stacks", "stop", "launch"], told(report)
    assert report.verdict is Verdict.HEALTHY and len(runs(t)) == 2, told(report)
    assert hung_run not in live_trainers(t) and len(live_trainers(t)) == 1


# ---------------------------------------------------------------------------------------------
# 4. A checkpoint that does not load is skipped, kept, and never taken again


@case(
    LOST,
    "`step_600.pt` (a real ~1 MiB `torch.save` file, beside a good `step_100.pt`) truncated for real: to half its size, or to its first 32 KiB (a save cut short early); the trainer dies in `torch.load` of it",
    "crashed / broken_checkpoint naming step_600.pt -> relaunched from step_100.pt, healthy; step_600.pt kept byte for byte and recorded in `STATE/skipped-checkpoints`; the next recovery (after a SIGKILL) resumes from step_100.pt again",
)
@pytest.mark.parametrize(
    ("zipped", "keep"), [(True, 0.5), (True, 32 << 10), (False, 0.5)], ids=["zip_cut_in_half", "zip_cut_at_32KiB", "legacy_cut_in_half"]
)
def test_a_checkpoint_that_does_not_load_is_skipped_kept_and_never_taken_again(made, tmp_path, zipped, keep):
    import torch

    t = made(launch_command=f"{TORCH_PYTHON} {trainer(tmp_path, 'resume.py', RESUMING_TRAINER)}", resume_arg="--resume {checkpoint}")
    ckpt = Path(t.checkpoint_dir)
    ckpt.mkdir(parents=True)
    for step in (100, 600):
        state = {"model": torch.nn.Linear(512, 512).state_dict(), "step": step}
        torch.save(state, ckpt / f"step_{step}.pt", _use_new_zipfile_serialization=zipped)
    broken = ckpt / "step_600.pt"
    os.truncate(broken, int(broken.stat().st_size * keep) if keep < 1 else keep)
    kept = sha256(broken)
    record, _ = launch.fn(t, 1)
    if zipped:
        # torch.save's zip says by its content that it was cut (no end record ends it): never given to the trainer.
        assert record.checkpoint == str(ckpt / "step_100.pt") and "cut short" in record.checkpoint_why, record.checkpoint_why
        assert sha256(broken) == kept, "the cut checkpoint is kept byte for byte"
        return
    # The legacy (pickle) format has no end record to read: judged by time, given, and refused once it fails to load.
    assert record.checkpoint == str(broken), record.checkpoint_why
    wait_for_exit(t, 60)

    report = recover(t)
    first = report.attempts[0]
    died = run_log(t, record.run_id)
    assert (first.verdict, first.cause, first.action) == (Verdict.CRASHED, Cause.BROKEN_CHECKPOINT, Action.RELAUNCH_EARLIER), (
        "BUG relaunch/judging/signatures.py SIGNATURES (Cause.BROKEN_CHECKPOINT): torch.load of a checkpoint cut short to between ~4 KiB "
        "and ~64 KiB fails inside `torch._C.PyTorchFileReader` with `OSError: [Errno 22] Invalid argument` (torch 2.13; the "
        "zip reader seeks before the file's start looking for the central directory), which no signature names: the crash "
        "is judged `error`, the full recovery relaunches onto the same step_600.pt and the run crash-loops into an escalation "
        f"instead of resuming from step_100.pt. The trainer's log:\n{died[-1500:]}\n{told(report)}"
    )
    assert f"the checkpoint it was given: {broken}" in first.evidence, told(report)
    assert any(
        e.startswith(
            ("RuntimeError: PytorchStreamReader failed reading zip archive", "OSError: [Errno 22]", "RuntimeError: unexpected EOF")
        )
        for e in first.evidence
    ), told(report)
    relaunch = step_detail(report, "launch")
    assert (
        relaunch.checkpoint == str(ckpt / "step_100.pt")
        and "'step_600.pt': failed to load in an earlier attempt" in relaunch.checkpoint_why
    ), relaunch
    assert report.verdict is Verdict.HEALTHY, told(report)
    assert f"resuming from {ckpt / 'step_100.pt'}" in run_log(t, relaunch.run_id) and "step=101 " in run_log(t, relaunch.run_id)
    assert sha256(broken) == kept, "the broken checkpoint is kept byte for byte"
    records = [r for r in Path(skipped_path(t)).read_bytes().split(b"\0") if r]
    assert len(records) == 1 and records[0].endswith(b"step_600.pt"), f"recorded once, by name: {records}"

    # The next failure: the relaunched trainer is killed; the recovery after it must not take step_600 again.
    ((_, pid),) = live_trainers(t)
    os.kill(pid, signal.SIGKILL)
    wait_for_exit(t)
    again = recover(t)
    assert (again.attempts[0].cause, again.attempts[0].action) == (Cause.KILLED, Action.RELAUNCH), told(again)
    assert step_detail(again, "launch").checkpoint == str(ckpt / "step_100.pt"), told(again)
    assert again.verdict is Verdict.HEALTHY and len(runs(t)) == 3, told(again)
    assert sha256(broken) == kept


# ---------------------------------------------------------------------------------------------
# 5. A diverged run resumes from before the divergence, once


@case(
    LOST,
    "a loss that overflows for real (a tiny torch model whose learning-rate schedule jumps at step 25: inf at 27, then nan); checkpoints every 10 steps, the later ones written after the divergence",
    "diverged -> relaunched from `step_20.pt` (the newest before the first non-finite step), which diverges again at the same step -> escalated; two launches",
)
def test_a_diverged_run_is_relaunched_from_before_the_divergence_and_escalated_when_it_diverges_again(made, tmp_path):
    slow_to_settle = FAST.model_copy(update={"healthy_steps": 12})  # a resumed run reaches the jump within 12 step lines
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    t = made(
        launch_command=f"{TORCH_PYTHON} {trainer(tmp_path, 'diverge.py', DIVERGING_TRAINER)} {ckpt}",
        checkpoint_dir=str(ckpt),
        resume_arg="--resume {checkpoint}",
        thresholds=slow_to_settle,
    )
    launch.fn(t, 1)
    wait_for(lambda: polled_verdict(t) is Verdict.DIVERGED, 90, "the loss to go non-finite")
    report = recover(t)
    first, second = report.attempts[0], report.attempts[-1]
    assert (first.verdict, first.action) == (Verdict.DIVERGED, Action.RELAUNCH_EARLIER), told(report)
    nonfinite = first.metrics.first_nonfinite_step
    assert nonfinite is not None and 25 <= nonfinite <= 30, told(report)
    relaunch = step_detail(report, "launch")
    assert relaunch.checkpoint == str(ckpt / "step_20.pt"), relaunch
    assert f"resuming from {ckpt / 'step_20.pt'}" in run_log(t, relaunch.run_id) and "step=21 " in run_log(t, relaunch.run_id)
    assert len(report.attempts) == 2 and (second.verdict, second.action) == (Verdict.DIVERGED, Action.ESCALATE), told(report)
    assert second.metrics.first_nonfinite_step == nonfinite, "the same step diverges again: the schedule, not bad luck"
    assert not report.ok and len(runs(t)) == 2, told(report)


# ---------------------------------------------------------------------------------------------
# 6. A native crash is relaunched once, escalated when it repeats


@case(
    MID_STEP,
    "a trainer that dies of a real SIGSEGV (`ctypes.string_at(0)`) five steps after every start, checkpointing each step",
    "crashed / native_crash (exit 139, SIGSEGV) -> relaunched once from its newest checkpoint; it crashes again though it progressed -> escalated (the once-only rule); two launches",
)
def test_a_native_crash_is_relaunched_once_and_escalated_when_it_repeats(made, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    crashes_before_settling = FAST.model_copy(update={"healthy_steps": 10})  # it dies 5 step lines after each start
    t = made(
        launch_command=f"{TORCH_PYTHON} {trainer(tmp_path, 'segv.py', SEGFAULT_TRAINER)} {ckpt}",
        checkpoint_dir=str(ckpt),
        resume_arg="--resume {checkpoint}",
        thresholds=crashes_before_settling,
    )
    launched_and_exited(t)
    report = recover(t)
    first = report.attempts[0]
    assert (first.verdict, first.cause, first.action) == (Verdict.CRASHED, Cause.NATIVE_CRASH, Action.RELAUNCH), told(report)
    assert "exit code 139 (SIGSEGV, raised by the trainer's own native code)" in first.evidence, told(report)
    assert step_detail(report, "launch").checkpoint == f"{t.checkpoint_dir}/step_5", told(report)
    assert len(report.attempts) == 2, told(report)
    second = report.attempts[1]
    assert (second.verdict, second.cause, second.action) == (Verdict.CRASHED, Cause.NATIVE_CRASH, Action.ESCALATE), told(report)
    assert second.metrics.last_step == 10 and "it repeats" in second.why, told(report)
    assert not report.ok and len(runs(t)) == 2 and live_trainers(t) == []
