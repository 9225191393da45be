"""`make scale-demo` (scripts/scale_demo.py) as a person runs it: real PostgreSQL, Redis, Prefect server (Redis broker,
cache, ordering, lease storage, docket; API auth on), two process workers, and SSH hosts in network namespaces of which
some are broken. It prints one JSON line; Ctrl-C or SIGTERM leaves no process, namespace or listening socket behind.

The start-up is `scale_demo.scale_engine()`, the context manager tests/test_scale_concurrency.py uses as well.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relaunch.testing.netns import require_netns
from relaunch.testing.sshd import cannot_run_here, require_sshd

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "scale_demo.py"


def load_scale_demo():
    """scripts/scale_demo.py as a module (scripts/ is not a package)."""
    if "scale_demo" not in sys.modules:
        spec = importlib.util.spec_from_file_location("scale_demo", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["scale_demo"] = module
        spec.loader.exec_module(module)
    return sys.modules["scale_demo"]


def require_scale_parts() -> None:
    """Skip (fail under CI=true) without what the demo runs on."""
    require_netns()
    require_sshd()
    if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        cannot_run_here("PostgreSQL is missing (/usr/lib/postgresql/*/bin/initdb): apt-get install -y postgresql")
    if shutil.which("redis-server") is None:
        cannot_run_here("redis-server is missing: apt-get install -y redis-server")
    if importlib.util.find_spec("prefect_redis") is None:
        cannot_run_here("prefect-redis is not installed: .venv/bin/pip install -e '.[test]'")


def scale_workdir() -> Iterator[Path]:
    """A folder PostgreSQL's unprivileged user can reach (pytest's tmp_path is mode 700, root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="relaunch-scale-"))
    base.chmod(0o755)
    try:
        yield base / "demo"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def workdir() -> Iterator[Path]:
    require_scale_parts()
    yield from scale_workdir()


def start(workdir: Path, *args: str) -> tuple[subprocess.Popen, list[str]]:
    """The script in a session of its own (as from a terminal); its stderr lines collected as they come."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--workdir", str(workdir), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []

    def pump() -> None:
        for line in proc.stderr:
            lines.append(line.rstrip())

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def wait_for_line(lines: list[str], pattern: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(re.search(pattern, line) for line in lines):
        assert proc.poll() is None, f"scale_demo.py exited {proc.returncode} before {pattern!r}:\n" + "\n".join(lines[-40:])
        assert time.monotonic() < deadline, f"no {pattern!r} within {timeout} s:\n" + "\n".join(lines[-40:])
        time.sleep(0.1)


def started_things(workdir: Path) -> dict:
    """What the run recorded (pids.json), plus every process inside its namespaces (the sshds and their sessions)."""
    record = json.loads((workdir / "pids.json").read_text())
    netns_pids = {
        ns: subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False).stdout.split()
        for ns in record["netns"]
    }
    return {**record, "netns_pids": netns_pids}


def leftovers(workdir: Path, things: dict, lines: list[str]) -> list[str]:
    sd = load_scale_demo()
    left = [f"{p['name']} (pid {p['pid']})" for p in things["processes"] if sd._proc_start_time(p["pid"]) == p["start_time"]]
    left += [f"pid {pid} of {ns}" for ns, pids in things["netns_pids"].items() for pid in pids if sd.alive(int(pid))]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    left += [f"namespace {ns}" for ns in things["netns"] if re.search(rf"^{re.escape(ns)}\b", listed, re.M)]
    for line in lines:
        for port in re.findall(r"on 127\.0\.0\.1:(\d+)", line):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", int(port))) == 0:
                    left.append(f"something still listens on 127.0.0.1:{port} ({line})")
    for pid_file in workdir.glob("targets/*/**/runs/*/pid"):
        pid, start_time = pid_file.read_text().split()[:2]
        if sd._proc_start_time(int(pid)) == start_time:
            left.append(f"trainer {pid} ({pid_file})")
    left += [f"folder {f}" for f in things.get("folders", []) if Path(f).exists()]
    if (workdir / "pids.json").exists():
        left.append(f"{workdir / 'pids.json'} (removed only once everything it lists is stopped)")
    return left


# Run against the demo's server (its URL and auth string read from its environment): a concurrency slot is
# taken with a lease, Redis scanned while it is held, the slot given back.
LEASE_PROBE = """import json, subprocess, sys
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
with get_client(sync_client=True) as client:
    client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name="lease-probe", limit=1))
with concurrency("lease-probe", occupy=1, strict=True, lease_duration=60):
    print(json.dumps(subprocess.run(sys.argv[1:], capture_output=True, text=True, check=True).stdout.split()))
"""


def keys_while_a_slot_is_leased(server_pid: int, redis_cli: list[str], home: Path) -> list[str]:
    environ = Path(f"/proc/{server_pid}/environ").read_bytes().decode().split("\0")
    settings = dict(e.split("=", 1) for e in environ if e.startswith(("PREFECT_API_URL=", "PREFECT_API_AUTH_STRING=")))
    env = {**os.environ, **settings, "PREFECT_HOME": str(home)}
    out = subprocess.run([sys.executable, "-c", LEASE_PROBE, *redis_cli], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_the_scale_demo_recovers_every_broken_host_exactly_once_says_so_in_one_json_line_and_ctrl_c_leaves_nothing_behind(workdir):
    proc, lines = start(workdir, "--hosts", "8", "--broken", "2", "--hold")
    try:
        out = proc.stdout.readline()  # the one JSON line; then it holds until a signal
        assert out, f"no JSON line; exit {proc.poll()}:\n" + "\n".join(lines[-60:])
        result = json.loads(out)
        wait_for_line(lines, r"holding:", proc, 30)
        things = started_things(workdir)
        names = {p["name"] for p in things["processes"]}
        redis_conf = (workdir / "redis" / "redis.conf").read_text()
        redis_cli = ["redis-cli", "-p", re.search(r"^port (\d+)", redis_conf, re.M)[1], "--no-auth-warning"]
        redis_cli += ["-a", re.search(r"^requirepass (\S+)", redis_conf, re.M)[1], "--scan"]
        redis_keys = subprocess.run(redis_cli, capture_output=True, text=True, timeout=30).stdout.split()
        server = next(p["pid"] for p in things["processes"] if p["name"] == "prefect server")
        lease_keys = keys_while_a_slot_is_leased(server, redis_cli, workdir / "lease-probe")
        pg_owner = (workdir / "pg" / "data").stat().st_uid
        postgres_pid = next(p["pid"] for p in things["processes"] if p["name"] == "postgres")
        postgres_uid = int(re.search(r"^Uid:\s+(\d+)", Path(f"/proc/{postgres_pid}/status").read_text(), re.M)[1])

        start_stop = time.monotonic()
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        code = proc.wait(timeout=120)
        stop_seconds = time.monotonic() - start_stop
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(json.dumps(result))  # shown with -s, and in the failure report
    assert {"hosts", "check_seconds", "recovered", "double_recoveries", "failed"} <= result.keys(), result
    assert result["hosts"] == 8 and len(result["broken"]) == 2, result
    assert sorted(result["recovered"]) == sorted(result["broken"]), f"every broken host recovered, no healthy one touched: {result}"
    assert result["double_recoveries"] == 0 and result["failed"] == [], result
    assert result["runs"] == 2 and result["workers_used"] == 2, f"the two fleet runs ran on both workers: {result}"
    assert result["recover_runs"] >= 2, "both fleet runs reached the broken hosts' recovery (one waited for the other)"
    assert {"postgres", "redis", "prefect server", "worker 0", "worker 1"} <= names, names
    assert pg_owner == postgres_uid != 0, "PostgreSQL runs as its own unprivileged user, owning its data folder"
    assert any("lease" in k for k in set(lease_keys) - set(redis_keys)), f"the lease storage is in Redis: {lease_keys[:30]}"
    assert any(k in ("events", "actions") or k.startswith("stream:") or "prefect-server" in k for k in redis_keys), (
        f"messaging and docket are in Redis: {redis_keys[:30]}"
    )
    assert code == 128 + signal.SIGINT, "\n".join(lines[-30:])
    assert stop_seconds < 60, stop_seconds
    assert leftovers(workdir, things, lines) == [], "\n".join(lines[-30:])


def test_sigterm_during_the_start_up_stops_what_was_started_by_its_recorded_pids(workdir):
    proc, lines = start(workdir, "--hosts", "3", "--broken", "1")
    try:
        wait_for_line(lines, r"hosts up", proc, 120)  # database, Redis, server (migrating) and hosts are there
        things = started_things(workdir)
        assert len(things["processes"]) >= 3 and len(things["netns"]) == 3, things
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert code == 128 + signal.SIGTERM, "\n".join(lines[-30:])
    assert proc.stdout.read() == "", "no JSON line for a run that was stopped"
    assert any("SIGTERM" in line for line in lines), lines[-10:]
    assert leftovers(workdir, things, lines) == [], "\n".join(lines[-30:])
