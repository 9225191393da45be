"""Fault injection for tests: the registry of guarantees (rendered to docs/fault-matrix.md), and real-fault helpers.

Every helper acts on real things: files and their sha256, /proc, process groups of PIDs this test
started or relaunch recorded (never a name pattern), a real tmpfs, a real wheel, a real PATH.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from relaunch import runlayout
from relaunch.config import Target
from relaunch.demo.wheels import write_wheel
from relaunch.testing.sshd import cannot_run_here

ROOT = Path(__file__).resolve().parents[2]  # the repository (relaunch/testing/faults.py)
DOC = ROOT / "docs" / "fault-matrix.md"
RELAUNCH = str(Path(sys.executable).parent / "relaunch")

# ---------------------------------------------------------------------------------------------
# The registry: one row per test, grouped by guarantee, rendered into docs/fault-matrix.md.

LOST = "Nothing is lost"
ONE = "Never two trainers"
RESUMABLE = "Idempotent and resumable"
BAD_INPUT = "Bad input fails clearly, host unchanged"
MID_STEP = "Faults during a step"
GUARANTEES = (LOST, ONE, RESUMABLE, BAD_INPUT, MID_STEP)


@dataclass(frozen=True)
class Case:
    guarantee: str
    fault: str
    outcome: str
    test: str  # path::function, from the repository root


REGISTRY: list[Case] = []


def case(guarantee: str, fault: str, outcome: str) -> Callable:
    """Register the decorated test as the proof of one row of the fault matrix."""
    if guarantee not in GUARANTEES:
        raise ValueError(f"unknown guarantee {guarantee!r}; one of {GUARANTEES}")

    def register(fn: Callable) -> Callable:
        path = Path(inspect.getsourcefile(fn)).resolve().relative_to(ROOT).as_posix()
        REGISTRY.append(Case(guarantee, fault, outcome, f"{path}::{fn.__name__}"))
        return fn

    return register


def reference(guarantee: str, fault: str, outcome: str, test: str) -> None:
    """A row proven by a test that lives elsewhere (e.g. the SSH transport's own tests)."""
    if guarantee not in GUARANTEES:
        raise ValueError(f"unknown guarantee {guarantee!r}")
    REGISTRY.append(Case(guarantee, fault, outcome, test))


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_matrix(cases: list[Case]) -> str:
    """The markdown table of docs/fault-matrix.md: guarantees in their fixed order, rows in test order."""
    lines = [
        "# Fault matrix",
        "",
        "What relaunch guarantees when things go wrong, and the test that proves each row by injecting",
        "the fault for real (real tmux, git, uv, processes, signals, a full tmpfs, a SIGKILLed",
        "orchestrator). Generated from the registry in `tests/test_fault_matrix.py` by its last test, run as",
        "`RELAUNCH_WRITE_DOCS=1 .venv/bin/python -m pytest tests/test_fault_matrix.py -k fault_matrix_doc`;",
        "without RELAUNCH_WRITE_DOCS=1 that test fails when this file and the registry differ.",
        "",
        "| guarantee | fault (injected for real) | outcome | test |",
        "| --- | --- | --- | --- |",
    ]
    # Rows of one file keep their order in it; files come in path order, whichever module was imported first.
    # A test module imported under two names (pytest's own collection and an import) registers its rows twice.
    seen: set[str] = set()
    unique = [c for c in cases if not (c.test in seen or seen.add(c.test))]
    by_file = sorted(enumerate(unique), key=lambda ic: (ic[1].test.split("::")[0], ic[0]))
    for guarantee in GUARANTEES:
        for _, c in by_file:
            if c.guarantee == guarantee:
                lines.append(f"| {_cell(c.guarantee)} | {_cell(c.fault)} | {_cell(c.outcome)} | `{c.test}` |")
    return "\n".join(lines) + "\n"


# Rows proven by tests outside tests/test_fault_matrix.py that no other row names.

reference(
    MID_STEP,
    "SSH connection cut (its sshd session process SIGKILLed) while a task's command runs on the host; then a command that exits 4 on the host",
    "the task retries the dropped connection once and succeeds; the failed command runs once: CommandFailed naming exit 4, never retried",
    "tests/test_remote_flow.py::test_a_dropped_connection_is_retried_by_prefect_and_a_failed_command_is_not",
)


# ---------------------------------------------------------------------------------------------
# Waiting on events (never a sleep as synchronisation).


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.02) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------
# Files: sha256 of trees, so "unchanged" and "never modified" are exact.


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree(root: Path, skip: tuple[Path, ...] = (), live: tuple[Path, ...] = ()) -> dict[str, str]:
    """Every path under root with its kind and content hash; `skip` prunes, `live` files keep only their path."""
    root, out = Path(root), {}
    skip = tuple(Path(s) for s in skip)
    live = {Path(p) for p in live}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(n for n in dirnames if here / n not in skip)
        for name in dirnames + sorted(filenames):
            path = here / name
            if path in skip:
                continue
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[rel] = "link -> " + os.readlink(path)
            elif path.is_dir():
                out[rel] = "dir"
            elif path in live:
                out[rel] = "live file"
            else:
                out[rel] = sha256(path)
    return out


def diff(before: dict[str, str], after: dict[str, str]) -> list[str]:
    lines = [f"removed {p}" for p in sorted(before.keys() - after.keys())]
    lines += [f"added {p}" for p in sorted(after.keys() - before.keys())]
    lines += [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return lines


# ---------------------------------------------------------------------------------------------
# Processes: only PIDs relaunch recorded (checked against their start time) or that a test started.


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat, or None when the process is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields and fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def group_members(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields and fields[0] != "Z" and int(fields[2]) == pgid:
                pids.append(int(entry.name))
    return pids


def _records(target: Target, name: str) -> list[tuple[str, int, str]]:
    runs = Path(runlayout.runs_folder(target.state_path))
    found = []
    for run in sorted(runs.iterdir()) if runs.is_dir() else []:
        try:
            pid, start = (run / name).read_text().split()[:2]
        except (OSError, ValueError):
            continue
        found.append((run.name, int(pid), start))
    return found


def live_trainers(target: Target) -> list[tuple[str, int]]:
    """(run id, PID) of every recorded trainer still alive: its PID exists with the recorded start time."""
    return [(run, pid) for run, pid, start in _records(target, "pid") if start_time(pid) == start]


def live_supervisor_groups(target: Target) -> list[int]:
    """Recorded supervisors still alive; each is the leader of its trainer's process group."""
    return [pid for _, pid, start in _records(target, "supervisor_pid") if start_time(pid) == start]


def tmux_session_alive(session: str) -> bool:
    return subprocess.run(["tmux", "has-session", "-t", f"={session}"], capture_output=True).returncode == 0


def reap(target: Target) -> None:
    """Teardown: end every trainer relaunch recorded for this target (all runs, not only the current) and its session."""
    for pgid in live_supervisor_groups(target):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for _, pid in live_trainers(target):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["tmux", "kill-session", "-t", f"={target.tmux_session}"], capture_output=True)


# stop.sh's exit code for a state folder that holds another target's records.
STATE_FOLDER_TAKEN = 20


@contextmanager
def making(tmp_path: Path, after: Callable[[Target], object] | None = None, **defaults: object) -> Iterator[Callable[..., Target]]:
    """A factory of shell targets under tmp_path (`after` readies each); at the end every trainer and session they
    started is stopped and reaped, even when one stop complains (the first complaint is raised after)."""
    from relaunch.errors import CommandFailed
    from relaunch.tasks.stop import stop
    from relaunch.testing.targets import shell_target

    targets: list[Target] = []

    def make(**overrides: object) -> Target:
        targets.append(shell_target(tmp_path / f"target{len(targets)}", **{**defaults, **overrides}))
        if after:
            after(targets[-1])
        return targets[-1]

    try:
        yield make
    finally:
        failures = []
        for t in targets:
            try:
                stop.fn(t)
            except CommandFailed as exc:
                # A target a test pointed at another target's state folder is refused (exit 20): that one is stopped
                # as its owner's.
                if exc.exit_code != STATE_FOLDER_TAKEN:
                    failures.append(exc)
            except Exception as exc:  # noqa: BLE001 - reap every target, then report
                failures.append(exc)
            reap(t)
        if failures:
            raise failures[0]


def kill_group(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGKILL a process this test started in its own session, and everything left in its group; wait until gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=timeout)
    wait_for(lambda: not group_members(proc.pid), timeout, f"process group {proc.pid} to be gone")


def dead_pid() -> int:
    """A PID that was ours and has exited (what a killed orchestrator leaves in its lock)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------------------------------------
# The orchestrator as a real process: `relaunch recover TARGET.yaml`.


def write_target(target: Target, path: Path) -> Path:
    path.write_text(yaml.safe_dump(target.model_dump(mode="json"), sort_keys=False))
    return path


def cli_env(home: Path, api_url: str | None = None, **extra: str) -> dict[str, str]:
    """The CLI's environment: its own PREFECT_HOME; the session's test server when given (no ephemeral one)."""
    env = {**os.environ, "PREFECT_HOME": str(home), "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **extra}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def start_cli(args: list[str], env: dict[str, str], output: Path) -> subprocess.Popen:
    """Start the CLI in its own session (its own process group), output to a file."""
    with open(output, "wb") as out:
        return subprocess.Popen(
            [RELAUNCH, *args], env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT
        )


def bin_without(folder: Path, *missing: str) -> Path:
    """A bin folder of symlinks to every command on PATH except `missing`: a host where they are not installed."""
    folder.mkdir(parents=True)
    for entry in os.environ["PATH"].split(os.pathsep):
        d = Path(entry)
        if not d.is_dir():
            continue
        for tool in d.iterdir():
            link = folder / tool.name
            if tool.name in missing or link.exists() or link.is_symlink():
                continue
            if tool.is_file() and os.access(tool, os.X_OK):
                link.symlink_to(tool)
    return folder


# ---------------------------------------------------------------------------------------------
# Disks and wheels.


@contextmanager
def tmpfs(mount_point: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A real small filesystem (read-only: one nobody, root included, can write to); skipped (with the reason) only
    where mounting is not permitted, failed so under CI=true."""
    mount_point.mkdir(parents=True, exist_ok=True)
    options = f"size={size},ro" if read_only else f"size={size}"
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)], capture_output=True, text=True)
    if result.returncode != 0:
        cannot_run_here(
            f"cannot mount a tmpfs here ({result.stderr.strip() or 'mount exited ' + str(result.returncode)}): the disk-full case needs mount permission"
        )
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def big_wheel(dest: Path, name: str, version: str, megabytes: int) -> Path:
    """A wheel carrying an incompressible data file of the given size (stored, not deflated)."""
    files = {f"{name}/__init__.py": f"__version__ = '{version}'\n".encode(), f"{name}/blob.bin": os.urandom(megabytes << 20)}
    return write_wheel(dest, name, version, files, zipfile.ZIP_STORED)
