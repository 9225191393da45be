#!/usr/bin/env python3
"""make scale-demo: relaunch's fleet check on the parts a shared control plane runs on, all on this machine.

    .venv/bin/python scripts/scale_demo.py [--hosts 8] [--broken 2] [--runs 2] [--workdir .cache/scale-demo] [--hold] [--ui]

Starts, each as a process of its own under WORKDIR (no system service, nothing through systemd):

1. PostgreSQL (Debian's `postgresql`: `initdb`, then `postgres` in the foreground) on 127.0.0.1 and a free port, as an
   unprivileged user (see `postgres_user`);
2. Redis (Debian's `redis-server`) on 127.0.0.1 and a free port, with a password;
3. a Prefect server on them: database on PostgreSQL; messaging broker, messaging cache, causal ordering, concurrency
   lease storage and docket on Redis (the `prefect-redis` package); API authentication on (`SERVER_SETTINGS`);
4. N SSH hosts (relaunch/testing/netns.py: an sshd per network namespace, each with its own address and host key), each with a
   trainer launched over SSH; BROKEN of them broken for real (crashed with exit code 3, or its trainer SIGKILLed);
5. the process work pool `relaunch`, a global concurrency limit `relaunch-host-<address>` of 1 per host, the
   deployments `check-fleet/scale-demo` (every host) and `recover-training/scale-demo`, and two process workers
   (`--limit 1` each, so two runs at once land on both).

Then RUNS `check-fleet/scale-demo` runs at once (as two overlapping nightly checks would be: both find the same broken
hosts) and prints ONE JSON line on stdout:

    {"hosts": 8, "check_seconds": 41.2, "recovered": ["host1", "host4"], "double_recoveries": 0, "failed": [], ...}

`recovered`: hosts whose trainer was relaunched (a launch record newer than the check's start); `double_recoveries`:
hosts with evidence of a second recovery (two launches, two live trainers, or two recover-training runs whose steps
overlap in the server's task-run history); `failed`: broken hosts not recovered, healthy hosts relaunched, hosts not
healthy at the end. Exit status 0 when `failed` is empty and `double_recoveries` is 0, else 1. Progress on stderr.

Ctrl-C (SIGINT) or SIGTERM, at any moment, stops everything it started, in reverse order, by the PIDs it recorded in
WORKDIR/pids.json (and their process groups): workers, server, Redis, PostgreSQL, trainers (by their records), sshds,
namespaces. A second signal during the stop is noted and the stop goes on. A run killed with SIGKILL leaves
WORKDIR/pids.json: the next run stops what it lists (each only while it still runs what was recorded) and removes the
namespaces it names before starting. `scale_engine()` is the same start-up as a context manager, for tests.
"""

from __future__ import annotations

import argparse
import base64
import glob
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

POOL = "relaunch"
FLEET_DEPLOYMENT = "check-fleet/scale-demo"
RECOVER_DEPLOYMENT = "recover-training/scale-demo"
# Debian's postgresql package creates this system user; on a machine without it, a system user of our own is created.
PG_FALLBACK_USER = "relaunch-pg"


def say(message: str) -> None:
    print(f"[scale-demo] {message}", file=sys.stderr, flush=True)


class Failure(RuntimeError):
    """Something the demo started did not come up: what, the command, its exit code, its output's tail, what to do."""


def failure(what: str, argv: list[str] | str, code: int | None, output: str, todo: str) -> Failure:
    cmd = argv if isinstance(argv, str) else " ".join(argv)
    tail = "\n".join(output.strip().splitlines()[-25:])
    return Failure(f"{what}\n  command: {cmd}\n  exit code: {code}\n  output (tail):\n{tail}\n  what to do: {todo}")


def log_tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-4000:]
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------------------------------------------------------------
# Signals: a SIGINT or SIGTERM ends the start-up or the run by an exception, so every `with` unwinds; never while a
# process is being started and recorded (it is raised once that is done), and never during the stop itself.


class Interrupted(BaseException):
    """SIGINT or SIGTERM (a BaseException, so no library's `except Exception` swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Signals:
    critical = 0
    pending: int | None = None
    stopping = False
    installed = False


def _on_signal(signum: int, _frame: object) -> None:
    if _Signals.stopping:
        say(f"{signal.Signals(signum).name}: still stopping what was started; it goes on in order")
        return
    if _Signals.critical:
        _Signals.pending = signum
        return
    raise Interrupted(signum)


def install_signal_handlers() -> None:
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    _Signals.installed = True


@contextmanager
def _critical() -> Iterator[None]:
    _Signals.critical += 1
    try:
        yield
    finally:
        _Signals.critical -= 1
        if not _Signals.critical and _Signals.pending is not None and not _Signals.stopping:
            signum, _Signals.pending = _Signals.pending, None
            raise Interrupted(signum)


# ---------------------------------------------------------------------------------------------------------------------
# Processes: each in a session (and process group) of its own, so a Ctrl-C in the terminal reaches this script alone,
# recorded with its command line in pids.json, stopped by that PID and process group only.


def _proc_start_time(pid: int) -> str | None:
    """The start time /proc records for pid (None: gone or a zombie): a recorded PID is ours only while it matches."""
    from relaunch.testing.faults import start_time

    return start_time(pid)


def alive(pid: int) -> bool:
    return _proc_start_time(pid) is not None


def descendants(root: int) -> list[int]:
    """root's descendants, read from /proc (children first in generation order)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, current = [], [root]
    while current := [p for p, pp in parents.items() if pp in current]:
        out.extend(current)
    return out


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    argv: list[str]
    log: Path
    start_time: str | None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None


class Procs:
    """What this run started, recorded in a file so that a later run can stop what a killed one left."""

    def __init__(self, record: Path) -> None:
        self.record = record
        self.procs: list[Proc] = []
        self.netns: list[str] = []
        self.folders: list[str] = []  # outside the work folder (the hosts' tmux socket folders): removed by a later run

    def _save(self) -> None:
        entries = [{"name": p.name, "pid": p.pid, "start_time": p.start_time, "argv": p.argv} for p in self.procs if p.running()]
        tmp = self.record.with_suffix(".tmp")
        tmp.write_text(json.dumps({"processes": entries, "netns": self.netns, "folders": self.folders}, indent=1))
        tmp.replace(self.record)

    def start(self, name: str, argv: list[str], env: dict[str, str], log: Path, cwd: Path = ROOT) -> Proc:
        with _critical(), log.open("ab") as out:
            popen = subprocess.Popen(
                argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
            proc = Proc(name, popen, argv, log, _proc_start_time(popen.pid))
            self.procs.append(proc)
            self._save()
        return proc

    def add_hosts(self, netns: list[str], folders: list[str]) -> None:
        with _critical():
            self.netns.extend(netns)
            self.folders.extend(folders)
            self._save()

    def stop(self, proc: Proc, first: signal.Signals = signal.SIGTERM, grace: float = 10.0, *, again: bool = False) -> None:
        """`first` to the process, up to `grace` s for it to exit (a second `first` halfway when `again`), then SIGKILL to
        its process group and to every descendant still running (a flow run a worker started, a postgres backend)."""
        if proc.running():
            family = descendants(proc.pid)
            try:
                os.kill(proc.pid, first)
            except ProcessLookupError:
                pass
            deadline, halfway = time.monotonic() + grace, time.monotonic() + grace / 2
            while proc.running() and time.monotonic() < deadline:
                if again and time.monotonic() > halfway:
                    again = False
                    try:
                        os.kill(proc.pid, first)
                    except ProcessLookupError:
                        pass
                time.sleep(0.05)
            self.kill(proc, family)
        if proc in self.procs:
            self.procs.remove(proc)
            self._save()

    def kill(self, proc: Proc, family: list[int] | None = None) -> None:
        """SIGKILL to proc's process group (it leads its own session) and to its descendants as recorded now."""
        family = (family or []) + descendants(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            say(f"{proc.name} (pid {proc.pid}) still there 10 s after SIGKILL")


def stop_leftovers(record: Path) -> None:
    """What a run killed with SIGKILL left, by its record: each process only while it still runs what was recorded."""
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return
    for entry in reversed(data.get("processes", [])):
        pid = entry["pid"]
        if _proc_start_time(pid) == entry["start_time"]:
            say(f"an earlier run left {entry['name']} (pid {pid}) running: stopping it")
            for target in [*descendants(pid), pid]:
                try:
                    os.kill(target, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout.split()
    for ns in data.get("netns", []):
        if ns in names:
            say(f"an earlier run left network namespace {ns}: removing it")
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    for folder in data.get("folders", []):
        shutil.rmtree(folder, ignore_errors=True)
    record.unlink(missing_ok=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check: Callable[[], bool], timeout: float, what: str, proc: Proc | None = None, todo: str = "") -> None:
    """Poll `check` until true (a deadline, never a fixed sleep); fail naming `what`, or the process that exited."""
    deadline = time.monotonic() + timeout
    while not check():
        if proc is not None and not proc.running():
            raise failure(
                f"{proc.name} exited while waiting for {what}",
                proc.argv,
                proc.popen.returncode,
                log_tail(proc.log),
                todo or f"read {proc.log}",
            )
        if time.monotonic() > deadline:
            out = log_tail(proc.log) if proc else ""
            raise failure(f"{what}: not within {timeout:g} s", proc.argv if proc else what, None, out, todo or "see the log above")
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------------------------------
# PostgreSQL


def postgres_bindir() -> Path:
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name) if Path(d).parent.name.isdigit() else 0)
    if not dirs or not Path(dirs[-1], "initdb").exists():
        raise failure(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb)",
            "ls /usr/lib/postgresql/*/bin/initdb",
            None,
            "",
            "apt-get install -y postgresql (.ci/run does), then run again",
        )
    return Path(dirs[-1])


def postgres_user() -> pwd.struct_passwd:
    """PostgreSQL refuses to run as root ("root" execution of the PostgreSQL server is not permitted), and this demo runs
    as root (network namespaces need it). So initdb and postgres run as an unprivileged system user: `postgres`, which
    Debian's postgresql package creates, else one made here (a system user with no home and no login shell)."""
    for name in ("postgres", PG_FALLBACK_USER):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    argv = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_FALLBACK_USER]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise failure(
            "could not create a system user to run PostgreSQL as",
            argv,
            out.returncode,
            out.stderr,
            "create one, or install postgresql (it creates `postgres`)",
        )
    return pwd.getpwnam(PG_FALLBACK_USER)


def as_user(user: pwd.struct_passwd, argv: list[str]) -> list[str]:
    # setpriv execs the command in place: the PID recorded is the program's own, signals reach it directly.
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "--", *argv]


def reachable_by(user: pwd.struct_passwd, path: Path) -> bool:
    out = subprocess.run(as_user(user, ["test", "-x", str(path)]), capture_output=True, check=False)
    return out.returncode == 0


@dataclass
class Postgres:
    port: int
    password: str
    url: str


@contextmanager
def postgres(folder: Path, procs: Procs) -> Iterator[Postgres]:
    bindir, user = postgres_bindir(), postgres_user()
    folder.mkdir(parents=True)
    os.chown(folder, user.pw_uid, user.pw_gid)
    if not reachable_by(user, folder):
        raise failure(
            f"user {user.pw_name} (PostgreSQL's) cannot reach {folder}",
            f"setpriv --reuid={user.pw_name} test -x {folder}",
            1,
            "",
            "use a --workdir whose parent folders are world-searchable (chmod o+x), e.g. under .cache/ or /tmp",
        )
    password = secrets.token_hex(16)
    pwfile = folder / "password"
    pwfile.write_text(password + "\n")
    os.chown(pwfile, user.pw_uid, user.pw_gid)
    pwfile.chmod(0o600)
    data = folder / "data"
    argv = as_user(
        user,
        [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "prefect",
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--no-locale",
        ],
    )
    out = subprocess.run(argv, cwd=folder, capture_output=True, text=True, check=False)
    pwfile.unlink()
    if out.returncode != 0:
        raise failure("initdb failed", argv, out.returncode, out.stdout + out.stderr, f"read the output; remove {folder} and run again")
    port = free_port()
    # TCP on 127.0.0.1 only, no unix socket (nothing left in /run/postgresql). fsync and synchronous_commit off: this
    # cluster is thrown away at the end, and the 2-core box spends its time on the demo rather than on disk flushes.
    argv = as_user(
        user,
        [
            str(bindir / "postgres"),
            "-D",
            str(data),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"port={port}",
            "-c",
            "unix_socket_directories=",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "max_connections=200",
        ],
    )
    proc = procs.start("postgres", argv, dict(os.environ), folder / "postgres.log", cwd=folder)
    ready = [str(bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port)]
    wait_until(lambda: subprocess.run(ready, check=False).returncode == 0, 60, "PostgreSQL to accept connections", proc)
    env = {**os.environ, "PGPASSWORD": password}
    argv = [
        str(bindir / "psql"),
        "-q",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "-U",
        "prefect",
        "-d",
        "postgres",
        "-c",
        "CREATE DATABASE prefect",
    ]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise failure(
            "could not create the database `prefect`", argv, out.returncode, out.stdout + out.stderr, f"read {folder / 'postgres.log'}"
        )
    say(f"PostgreSQL {bindir.parent.name} on 127.0.0.1:{port} as user {user.pw_name} (pid {proc.pid})")
    try:
        yield Postgres(port, password, f"postgresql+asyncpg://prefect:{password}@127.0.0.1:{port}/prefect")
    finally:
        procs.stop(proc, signal.SIGINT, 30)  # SIGINT: PostgreSQL's fast shutdown


# ---------------------------------------------------------------------------------------------------------------------
# Redis


@dataclass
class Redis:
    port: int
    password: str

    def url(self, db: int) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/{db}"


@contextmanager
def redis(folder: Path, procs: Procs) -> Iterator[Redis]:
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(exe).exists():
        raise failure(
            "redis-server is not installed",
            "command -v redis-server",
            None,
            "",
            "apt-get install -y redis-server (.ci/run does), then run again",
        )
    folder.mkdir(parents=True)
    password, port = secrets.token_hex(16), free_port()
    conf = folder / "redis.conf"  # the password in a file of our own (mode 600), not on a command line `ps` shows
    conf.write_text(
        f'port {port}\nbind 127.0.0.1\nprotected-mode yes\nunixsocket ""\nrequirepass {password}\n'
        f'save ""\nappendonly no\ndir {folder}\ndaemonize no\nlogfile ""\n'
    )
    conf.chmod(0o600)
    proc = procs.start("redis", [exe, str(conf)], dict(os.environ), folder / "redis.log", cwd=folder)
    import redis as redis_py

    def answers() -> bool:
        try:
            return bool(redis_py.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=2).ping())
        except redis_py.RedisError:
            return False

    wait_until(answers, 30, "Redis to answer PING", proc)
    say(f"Redis on 127.0.0.1:{port} (pid {proc.pid})")
    try:
        yield Redis(port, password)
    finally:
        procs.stop(proc, signal.SIGTERM, 10)


# ---------------------------------------------------------------------------------------------------------------------
# The Prefect server and its clients


def server_settings(db: Postgres, rd: Redis, auth: str, ui: bool) -> dict[str, str]:
    """The server's settings, each named as in Prefect 3.9.1 and prefect-redis 0.3.0 (docs/operations.md says why)."""
    return {
        "PREFECT_SERVER_DATABASE_CONNECTION_URL": db.url,
        "PREFECT_SERVER_EVENTS_MESSAGING_BROKER": "prefect_redis.messaging",
        "PREFECT_SERVER_EVENTS_MESSAGING_CACHE": "prefect_redis.messaging",
        "PREFECT_SERVER_EVENTS_CAUSAL_ORDERING": "prefect_redis.ordering",
        "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "prefect_redis.lease_storage",
        "PREFECT_REDIS_MESSAGING_URL": rd.url(0),
        "PREFECT_SERVER_DOCKET_URL": rd.url(1),
        "PREFECT_SERVER_API_AUTH_STRING": auth,
        "PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS": "2",
        "PREFECT_SERVER_CONCURRENCY_MAXIMUM_CONCURRENCY_SLOT_WAIT_SECONDS": "2",
        "PREFECT_SERVER_UI_ENABLED": "true" if ui else "false",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }


def basic_auth(auth: str) -> str:
    return "Basic " + base64.b64encode(auth.encode()).decode()


def healthy(api_url: str, auth: str) -> bool:
    request = urllib.request.Request(f"{api_url}/health", headers={"Authorization": basic_auth(auth)})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def client_env(api_url: str, auth: str, home: Path) -> dict[str, str]:
    """What every client of this server gets (workers, the CLI): no server setting, no password but the API's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_SERVER_", "PREFECT_REDIS_", "PREFECT_API_"))}
    env.update(
        {
            "PREFECT_API_URL": api_url,
            "PREFECT_API_AUTH_STRING": auth,
            "PREFECT_HOME": str(home),
            "DO_NOT_TRACK": "1",
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            # Heartbeats every 30 s (the least Prefect takes; default 180): a run whose worker died is found sooner.
            "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
            "PREFECT_LOGGING_LEVEL": "INFO",
            # One result store for every worker and client (here a folder they all see; across machines, one mount
            # at this same path, or PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK): a run's result is readable from any of them.
            "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home.parent / "results"),
            "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }
    )
    return env


# ---------------------------------------------------------------------------------------------------------------------
# Hosts


def _launch_trainers(targets: list[Any], broken: dict[int, str]) -> None:
    from relaunch import runlayout
    from relaunch.tasks.launch import launch
    from relaunch.testing.targets import wait_for_exit

    def one(i: int) -> None:
        target = targets[i]
        if broken.get(i) == "crashed":  # exits 3 at step 2, for real
            launch.fn(target.model_copy(update={"env": {"EXIT_AT": "2", "EXIT_CODE": "3"}}), 1)
            wait_for_exit(target)
            return
        detail, _ = launch.fn(target, 1)
        if broken.get(i) == "killed":  # SIGKILLed by its recorded PID after its first steps: dies without a word
            record = Path(runlayout.record(target.state_path, detail.run_id, runlayout.PID))
            wait_until(record.exists, 30, f"{target.name}'s trainer to record its PID")
            os.kill(int(record.read_text().split()[0]), signal.SIGKILL)
            wait_for_exit(target)

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, range(len(targets))))


def launch_records(target: Any) -> list[str]:
    from relaunch.testing.targets import runs

    return runs(target)


def live_trainers(target: Any) -> list[int]:
    """PIDs of the target's trainers still running, from every launch record (PID and start time, as recorded)."""
    from relaunch import runlayout

    out = []
    for run_id in launch_records(target):
        try:
            pid, start = Path(runlayout.record(target.state_path, run_id, runlayout.PID)).read_text().split()[:2]
        except (OSError, ValueError):
            continue
        if _proc_start_time(int(pid)) == start:
            out.append(int(pid))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# The engine


@dataclass
class Engine:
    workdir: Path
    api_url: str
    auth: str
    home: Path
    procs: Procs
    fleet: Any
    targets: list[Any]
    broken: dict[int, str]
    workers: list[Proc | None] = field(default_factory=list)
    worker_names: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return client_env(self.api_url, self.auth, self.home)

    @contextmanager
    def settings(self) -> Iterator[None]:
        from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: self.api_url, PREFECT_API_AUTH_STRING: self.auth}):
            yield

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """fn(client) with a synchronous client of this server."""
        from prefect.client.orchestration import get_client

        with self.settings(), get_client(sync_client=True) as client:
            return fn(client)

    def prefect(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "prefect"), *args], cwd=ROOT, env={**self.env(), "COLUMNS": "400"}, capture_output=True, text=True, timeout=timeout
        )

    # Workers ------------------------------------------------------------------------------------------------------
    def start_worker(self, i: int) -> Proc:
        name = f"scale-demo-{os.getpid()}-w{i}-{int(time.time() * 1000) % 10**8}"
        argv = [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--type", "process", "--name", name, "--limit", "1"]
        proc = self.procs.start(f"worker {i}", argv, self.env(), self.workdir / "logs" / f"worker-{i}.log")
        while len(self.workers) <= i:
            self.workers.append(None)
            self.worker_names.append("")
        self.workers[i], self.worker_names[i] = proc, name
        return proc

    def wait_workers_online(self, timeout: float = 120) -> None:
        def online() -> bool:
            listed = {w.name for w in self.call(lambda c: c.read_workers_for_work_pool(POOL)) if str(w.status).endswith("ONLINE")}
            return all(n in listed for n, p in zip(self.worker_names, self.workers) if p)

        for proc in self.workers:
            if proc:
                wait_until(online, timeout, "the workers to show ONLINE on the server", proc)

    def stop_worker(self, i: int) -> None:
        """A Prefect 3.9 worker turns its first SIGINT into a graceful stop and its second into a SIGKILL of itself."""
        proc = self.workers[i]
        if proc:
            self.procs.stop(proc, signal.SIGINT, 6, again=True)
            self.workers[i] = None

    def kill_worker(self, i: int) -> None:
        """SIGKILL to the worker, its process group and every flow-run process under it: a machine that died."""
        proc = self.workers[i]
        if proc:
            self.procs.kill(proc)
            self.procs.stop(proc)
            self.workers[i] = None

    def worker_of(self, flow_run_id: Any) -> int | None:
        """Which worker ran the run, from the workers' own logs ("Worker '...' submitting flow run 'ID'"). Two workers
        polling at once may both pick a run up; the server lets one through and the other logs "Aborted submission"."""
        for i, name in enumerate(self.worker_names):
            log = log_tail_full(self.workdir / "logs" / f"worker-{i}.log")
            if (
                f"Worker '{name}' submitting flow run '{flow_run_id}'" in log
                and f"Aborted submission of flow run '{flow_run_id}'" not in log
            ):
                return i
        return None

    def submissions(self) -> str:
        """Every worker's "submitting flow run" lines, for a failure message."""
        logs = [log_tail_full(self.workdir / "logs" / f"worker-{i}.log") for i in range(len(self.worker_names))]
        return "\n".join(
            f"worker {i}: {line}" for i, text in enumerate(logs) for line in text.splitlines() if "submitting flow run" in line
        )

    # Runs ---------------------------------------------------------------------------------------------------------
    def run(self, deployment: str, parameters: dict[str, Any] | None = None, name: str | None = None) -> Any:
        """A flow run of the deployment, created as `prefect deployment run` does; returns its id."""

        def create(client: Any) -> Any:
            d = client.read_deployment_by_name(deployment)
            return client.create_flow_run_from_deployment(d.id, parameters=parameters or {}, name=name).id

        return self.call(create)

    def wait_runs(self, ids: list[Any], timeout: float) -> list[Any]:
        """Every run in a final state (polled, with a deadline); returns them."""
        deadline = time.monotonic() + timeout
        while True:
            runs = [self.call(lambda c, i=i: c.read_flow_run(i)) for i in ids]
            if all(r.state and r.state.is_final() for r in runs):
                return runs
            if time.monotonic() > deadline:
                states = ", ".join(f"{r.name}: {r.state.name if r.state else '-'}" for r in runs)
                raise failure(
                    f"flow runs not finished within {timeout:g} s ({states})",
                    "prefect flow-run inspect ID",
                    None,
                    "".join(log_tail(p.log) for p in self.workers if p),
                    f"read the worker logs in {self.workdir / 'logs'}",
                )
            time.sleep(0.5)

    def fleet_rows(self, flow_run_id: Any) -> tuple[list[dict[str, Any]], float | None]:
        """The run's `check-fleet` table artifact: one row per target, and the check phase's seconds from its summary.
        (Not the run's result: Prefect pickles it under the module name the worker loaded the entrypoint as, `fleet`.)"""
        import re

        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

        found = self.call(
            lambda c: c.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=["check-fleet"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
                )
            )
        )
        if not found:
            return [], None
        data = found[0].data
        rows = json.loads(data) if isinstance(data, str) else data
        m = re.search(r"checks ([0-9.]+) s", found[0].description or "")
        return rows, float(m[1]) if m else None

    def recovery_windows(self, since: datetime) -> dict[str, list[tuple[Any, datetime, datetime]]]:
        """recover-training runs since `since`, per host (their `host:` tag): from the first step after the host's slot
        and lock were taken (every task run but preflight) to the end of the last one, from the server's history."""
        from prefect.client.schemas.filters import (
            FlowFilter,
            FlowFilterName,
            FlowRunFilter,
            FlowRunFilterId,
            FlowRunFilterStartTime,
        )

        def read(client: Any) -> dict[str, list[tuple[Any, datetime, datetime]]]:
            runs = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["recover-training"])),
                flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=since)),
            )
            out: dict[str, list[tuple[Any, datetime, datetime]]] = {}
            for run in runs:
                host = next((t.removeprefix("host:") for t in run.tags if t.startswith("host:")), "?")
                tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
                steps = [t for t in tasks if t.start_time and not t.name.startswith("preflight")]
                if steps:
                    start = min(t.start_time for t in steps)
                    end = max(t.end_time or t.start_time for t in steps)
                    out.setdefault(host, []).append((run.id, start, end))
            return out

        return self.call(read)

    def create_host_limits(self) -> None:
        from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

        from relaunch.flows.recover import host_limit_name

        names = sorted({host_limit_name(t) for t in self.targets})
        self.call(lambda c: [c.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=n, limit=1)) for n in names])


def log_tail_full(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def overlapping(windows: list[tuple[Any, datetime, datetime]]) -> list[tuple[Any, Any]]:
    ordered = sorted(windows, key=lambda w: w[1])
    return [(a[0], b[0]) for i, a in enumerate(ordered) for b in ordered[i + 1 :] if b[1] < a[2]]


def _deploy(engine: Engine) -> None:
    """The work pool and the two deployments, as `prefect deploy` would make them from prefect.yaml's templates."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.utilities.callables import parameter_schema
    from prefect.workers.process import ProcessWorker

    from relaunch.flows.fleet import check_fleet
    from relaunch.flows.recover import recover_training

    pull = [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]
    fleet_params = {"targets": [t.model_dump(mode="json") for t in engine.targets], "recover": True, "max_concurrent": 8}

    def deploy(client: Any) -> None:
        try:
            client.create_work_pool(
                WorkPoolCreate(name=POOL, type="process", base_job_template=ProcessWorker.get_default_base_job_template())
            )
        except ObjectAlreadyExists:
            pass
        for flow, name, entrypoint, params in [
            (check_fleet, "scale-demo", "flows/fleet.py:check_fleet", fleet_params),
            (recover_training, "scale-demo", "flows/recover.py:recover_training", {}),
        ]:
            client.create_deployment(
                flow_id=client.create_flow_from_name(flow.name),
                name=name,
                entrypoint=entrypoint,
                work_pool_name=POOL,
                path=str(ROOT),
                pull_steps=pull,
                parameters=params,
                parameter_openapi_schema=parameter_schema(flow).model_dump_for_openapi(),
                enforce_parameter_schema=False,
            )

    engine.call(deploy)


@contextmanager
def scale_engine(
    workdir: Path,
    hosts: int,
    broken: int,
    *,
    ui: bool = False,
    workers: int = 2,
    launch: bool = True,
    host_bins: dict[int, Path] | None = None,
) -> Iterator[Engine]:
    """Everything the demo runs on, up and ready; all of it stopped on the way out (an exception, Ctrl-C, SIGTERM).
    `host_bins` (tests): host i's sessions find that folder's commands first (relaunch/testing/netns.py fleet_of_hosts)."""
    if broken > hosts:
        raise ValueError(f"--broken {broken} is more than --hosts {hosts}")
    workdir = workdir.resolve()
    record = workdir / "pids.json"
    stop_leftovers(record)
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    workdir.chmod(0o755)
    (workdir / "logs").mkdir()
    procs = Procs(record)
    started = time.monotonic()
    with ExitStack() as stack:
        stack.callback(lambda: record.unlink(missing_ok=True) if not procs.procs else None)
        try:
            yield from _start(stack, workdir, procs, hosts, broken, ui, workers, launch, started, host_bins)
        finally:
            _Signals.stopping = True  # before the stack unwinds: a signal from here on is noted, the stop goes on in order
    _Signals.stopping = False


def _start(
    stack: ExitStack,
    workdir: Path,
    procs: Procs,
    hosts: int,
    broken: int,
    ui: bool,
    workers: int,
    launch: bool,
    started: float,
    host_bins: dict[int, Path] | None = None,
) -> Iterator[Engine]:
    from relaunch.testing.netns import fleet_of_hosts
    from relaunch.testing.targets import shell_target
    from relaunch.wire.transport import close_all

    db = stack.enter_context(postgres(workdir / "pg", procs))
    rd = stack.enter_context(redis(workdir / "redis", procs))
    auth = f"relaunch:{secrets.token_hex(16)}"
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    home = workdir / "prefect-home"
    home.mkdir()
    server_env = {**client_env(api_url, auth, home), **server_settings(db, rd, auth, ui)}
    argv = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    server = procs.start("prefect server", argv, server_env, workdir / "logs" / "server.log")
    stack.callback(procs.stop, server, signal.SIGTERM, 20)
    say(f"Prefect server starting on 127.0.0.1:{port} (pid {server.pid}; log {workdir / 'logs' / 'server.log'})")

    # While the server migrates its database: the hosts, their targets and trainers.
    fleet = stack.enter_context(fleet_of_hosts(hosts, workdir / "hosts", host_bins))
    procs.add_hosts([h.netns for h in fleet.net.hosts], [str(d) for d in fleet.tmux_dirs])
    targets = [
        shell_target(
            workdir / "targets" / f"host{i}",
            name=f"host{i}",
            host=s.ssh_host(connect_timeout_seconds=5.0, command_timeout_seconds=30.0),
        )
        for i, s in enumerate(fleet.servers)
    ]
    kinds = ["crashed", "killed"]
    step = hosts / broken if broken else 0
    broken_at = {int(k * step): kinds[k % 2] for k in range(broken)}
    stack.callback(close_all)  # after the trainers' stop (its connections too), before the sshds go
    stack.callback(_stop_trainers, targets)
    if launch:
        _launch_trainers(targets, broken_at)
        say(
            f"{hosts} hosts up, each an sshd in its own network namespace; trainers running, broken: "
            + ", ".join(f"host{i} ({k})" for i, k in broken_at.items())
        )

    wait_until(lambda: healthy(api_url, auth), 240, "the Prefect server to answer /api/health", server, f"read {server.log}")
    say(f"Prefect server healthy ({time.monotonic() - started:.0f} s after the start)")
    engine = Engine(workdir, api_url, auth, home, procs, fleet, targets, broken_at)
    _deploy(engine)
    engine.create_host_limits()
    for i in range(workers):
        engine.start_worker(i)
    stack.callback(lambda: [engine.stop_worker(i) for i in range(len(engine.workers))])
    engine.wait_workers_online()
    say(
        f"ready in {time.monotonic() - started:.0f} s: pool '{POOL}', deployments {FLEET_DEPLOYMENT} and {RECOVER_DEPLOYMENT}, {workers} workers"
    )
    yield engine
    say("stopping")


def _stop_trainers(targets: list[Any]) -> None:
    """Every trainer on the hosts, by its records (relaunch's own stop); what is left dies with its namespace."""
    from concurrent.futures import ThreadPoolExecutor

    from relaunch.plans.stop import plan_stop
    from relaunch.wire.transport import run, transport_for

    def stop(t: Any) -> None:
        try:
            run(transport_for(t.host), plan_stop(t, 5), check=False)
        except Exception as exc:  # noqa: BLE001 - the namespace's end kills what is left
            say(f"{t.name}: could not stop its trainer by its records ({exc}); it is killed with its namespace")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(stop, targets))


# ---------------------------------------------------------------------------------------------------------------------
# The demo


def demo(engine: Engine, runs: int, timeout: float = 300) -> dict[str, Any]:
    """RUNS check-fleet runs through the deployment at once; the evidence of what happened on every host."""
    before = {t.name: set(launch_records(t)) for t in engine.targets}
    since = datetime.now(UTC)
    start = time.monotonic()
    ids = [engine.run(FLEET_DEPLOYMENT, name=f"scale-demo-{k + 1}") for k in range(runs)]
    say(f"{runs} run(s) of {FLEET_DEPLOYMENT} created: {', '.join(str(i) for i in ids)}")
    flow_runs = engine.wait_runs(ids, timeout)
    check_seconds = round(time.monotonic() - start, 1)
    for r in flow_runs:
        say(f"{r.name}: {r.state.name} (worker {engine.worker_of(r.id)}) {r.state.message or ''}".rstrip())

    tables = [engine.fleet_rows(r.id) for r in flow_runs]
    windows = engine.recovery_windows(since)
    recovered, failed, doubles = [], [], []
    for i, t in enumerate(engine.targets):
        new = sorted(set(launch_records(t)) - before[t.name])
        live = live_trainers(t)
        overlaps = overlapping(windows.get(t.host.hostname, []))
        if new:
            recovered.append(t.name)
        if len(new) > 1 or len(live) > 1 or overlaps:
            doubles.append(t.name)
            say(f"{t.name}: {len(new)} launches, {len(live)} live trainers, overlapping recoveries {overlaps}")
        rows = [row for table, _ in tables for row in table if row.get("target") == t.name]
        why = []
        if i in engine.broken and not new:
            why.append("broken and not relaunched")
        if i not in engine.broken and new:
            why.append("healthy and relaunched")
        if not live:
            why.append("no trainer running")
        if len(rows) != len(flow_runs) or not all(row.get("ok") for row in rows):
            why.append(
                "not healthy in every fleet run's table: " + ", ".join(str(row.get("message"))[:120] for row in rows if not row.get("ok"))
            )
        if why:
            failed.append(f"{t.name}: {'; '.join(why)}")
    for r in flow_runs:
        if not r.state.is_completed():
            failed.append(f"flow run {r.name}: {r.state.name}: {(r.state.message or '')[:200]}")
    used = sorted({w for w in (engine.worker_of(r.id) for r in flow_runs) if w is not None})
    phase = [seconds for _, seconds in tables if seconds is not None]
    return {
        "hosts": len(engine.targets),
        "check_seconds": check_seconds,
        "recovered": recovered,
        "double_recoveries": len(doubles),
        "failed": failed,
        "broken": [engine.targets[i].name for i in sorted(engine.broken)],
        "runs": runs,
        "workers_used": len(used),
        "check_phase_seconds": max(phase) if phase else None,
        "recover_runs": sum(len(w) for w in windows.values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=8, help="SSH hosts, each in its own network namespace (default 8).")
    parser.add_argument("--broken", type=int, default=2, help="How many of them have a dead trainer (default 2).")
    parser.add_argument("--runs", type=int, default=2, help="check-fleet runs started at once (default 2: one per worker).")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=ROOT / ".cache" / "scale-demo",
        help="Where everything lives (default .cache/scale-demo; emptied first).",
    )
    parser.add_argument("--timeout", type=float, default=300, help="Seconds the fleet runs may take (default 300).")
    parser.add_argument("--hold", action="store_true", help="After the JSON line, keep everything running until Ctrl-C or SIGTERM.")
    parser.add_argument("--ui", action="store_true", help="Serve Prefect's UI too (it prints the address).")
    args = parser.parse_args(argv)
    if not 1 <= args.hosts <= 200 or not 0 <= args.broken <= args.hosts:
        parser.error("need 1 <= --hosts <= 200 and 0 <= --broken <= --hosts")
    install_signal_handlers()
    code = 0
    try:
        with scale_engine(args.workdir, args.hosts, args.broken, ui=args.ui) as engine:
            if args.ui:
                say(f"UI http://{engine.api_url.removeprefix('http://').removesuffix('/api')} (user:password {engine.auth})")
            result = demo(engine, args.runs, args.timeout)
            print(json.dumps(result), flush=True)
            code = 0 if not result["failed"] and not result["double_recoveries"] else 1
            if args.hold:
                (engine.home / "auth").write_text(engine.auth)
                (engine.home / "auth").chmod(0o600)
                say(
                    f"holding: PREFECT_API_URL={engine.api_url} PREFECT_API_AUTH_STRING=$(cat {engine.home / 'auth'}); Ctrl-C stops everything"
                )
                threading.Event().wait()
    except Interrupted as exc:
        say(f"{exc}: everything this run started is stopped")
        return 128 + exc.signum
    except Failure as exc:
        say(f"failed: {exc}")
        return 2
    say("stopped")
    return code


if __name__ == "__main__":
    sys.exit(main())
