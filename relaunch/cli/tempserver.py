"""A temporary Prefect API server that dies with the `relaunch` process that started it.

The problem. With no PREFECT_API_URL, Prefect 3 starts a temporary ("ephemeral") API server on first
use: `prefect.server.api.server.SubprocessASGIServer` runs `subprocess.Popen([python, -m, uvicorn,
... create_app])` and stops it from an `atexit` hook. A CLI that is SIGKILLed (or OOM-killed, or dies
of an unhandled SIGTERM) runs no atexit hook, so the server (~200 MB) is orphaned and keeps running.

The mechanism chosen: relaunch starts that same server itself, as its own child, before Prefect is
imported, and points PREFECT_API_URL at it; Prefect then sees a configured server and starts none.
PREFECT_API_URL is a public, stable setting, so no Prefect internals are patched. Owning the Popen
call is what lets the child be tied to this process, twice over:

- A lifeline pipe. Only this process holds its write end (`os.pipe` fds are not inherited by other
  children); when this process dies, however it dies, the kernel closes it, and a thread in the
  server reads EOF and shuts the server down (SIGTERM to itself, a hard exit after a grace period).
  Portable, and indifferent to which thread started the server.
- Linux `PR_SET_PDEATHSIG(SIGTERM)`, set in the server first thing, then `getppid()` checked to close
  the race with a parent that died before. This covers what the pipe misses: a child of ours forked
  without exec (multiprocessing's fork start method) would inherit the write end and keep the pipe
  open. PDEATHSIG fires when the *thread* that forked exits, so `main()` starts the server from the
  main thread, before anything else.

The listening socket is bound here (kernel-chosen port) and handed to the server, so there is no port
race, and this process does not wait for the server to boot: requests made before it is up wait in
the socket's backlog. The server boots (~4 s) while the CLI imports its flows, so the CLI gets faster.

Rejected: (a) `prctl` from a `preexec_fn` in Prefect's own Popen means monkeypatching the private
`SubprocessASGIServer._run_uvicorn_command`, and `preexec_fn` is unsafe once threads exist (Prefect
starts them freely). (c) A watchdog wrapper around Prefect's server needs that same Popen call.

Only when needed: commands that run no flow (help, diagnose, `recover --dry-run`, ...) start nothing; a
server that is configured (PREFECT_API_URL, the active profile, prefect.toml/.env/pyproject.toml) is left
to Prefect; and where nothing is configured but a Prefect server of this user answers where `prefect server
start` and `make serve` listen (127.0.0.1:4200), relaunch uses that one (saying so on stderr) instead of
booting its own, which costs seconds of CPU (importing Prefect's server and building its app: 3-5 s on 2 cores).

Whose server that is. On a shared host 127.0.0.1:4200 may be another person's server: flow runs, their
parameters (targets, hosts) and logs would go to it. It is used only when every socket listening there
belongs to this uid, as the kernel records it in /proc/net/tcp and /proc/net/tcp6 (the `uid` column: the
owner of the process that opened the socket). Chosen over `$PREFECT_HOME/server.pid` (what scripts/serve.sh
writes) because that file is in the PREFECT_HOME of whoever ran `make serve` (by default the checkout's own
.cache/prefect-home, not the ~/.prefect a person's CLI reads), says nothing about a `prefect server start`
typed by hand, and names the `prefect server start` process while the socket is its uvicorn child's; the
uid is the kernel's own record of the listener, for any way the server was started, read without talking to
it. Its limit: people who share one account (several people as root on a GPU box) share a uid, so it cannot
tell them apart; they set PREFECT_API_URL. A listener of another uid (or one whose owner cannot be read) is
not used and not even asked: this command starts its temporary server and says, once, how to configure one.

Bounded waits on the API (`api_client_defaults`, `unanswered_api`): Prefect's client waits 60 s per request
(PREFECT_API_REQUEST_TIMEOUT) and retries a timed-out request 5 times (PREFECT_CLIENT_MAX_RETRIES) after
2, 4, 8, 16, 32 s (+20% jitter): a server that accepts connections and never answers held `relaunch check`
for over 400 s on its first request, printing nothing. Two bounds, set by relaunch only where the user has
set nothing: (1) before any flow runs, so before any host action, `GET {api}/health` must get an answer
(any HTTP status) within API_ANSWER_SECONDS, else the command ends with exit 3 naming the URL; (2) each
request's timeout is API_REQUEST_TIMEOUT_SECONDS, so a server that hangs mid-run fails each request after
at most (1 + 5 retries) x 30 s + 74 s of backoff = 254 s, and the flow (and command) ends with it. The
retries are Prefect's and kept: they carry a recovery across a server restart.

Fail safe: whether Prefect would start a temporary server at all (no URL in the active profile or
prefect.toml, ephemeral mode on) is decided by the server child with Prefect's own settings (this
process waits the ~1 s that takes), before PREFECT_API_URL is set here; if not, it exits and nothing
changes. If it cannot start, a warning is printed and Prefect's own behaviour takes over. The CLI
never fails because of this module.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# The commands that run Prefect flows, each with the flow modules it imports (relaunch/cli/startup.py imports them
# before the command runs, an agent all of them at its start); the others (diagnose, rollback-venv, --help) never
# need a server. `gpus` runs no flow, but reads and writes the GPU ledger on the API all the same; `goodput` reads
# what the flow runs recorded (through Prefect's own ephemeral server it timed out on a loaded host). `status` is not
# here: with no API configured it shows what the hosts know (a temporary server holds no night's verdict).
FLOW_MODULES: dict[str, tuple[str, ...]] = {
    "check": ("relaunch.flows.check",),
    "recover": ("relaunch.flows.recover",),
    "demo": ("relaunch.flows.recover",),
    "fleet": ("relaunch.flows.fleet",),
    "watch": ("relaunch.flows.recover", "relaunch.flows.watch"),
    "gpus": (),
    "goodput": (),
}
FLOW_COMMANDS = frozenset(FLOW_MODULES)
PREFECT_APP = "prefect.server.api.server:create_app"
# The environment Prefect gives its own temporary server (prefect 3.9.1, SubprocessASGIServer):
# no UI, and the ephemeral set of background services.
SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
# Server exit code: Prefect would not start a temporary server here (a server is configured elsewhere).
NOT_WANTED = 5
# uvicorn's exit code when the app fails to start.
STARTUP_FAILURE = 3
GO = b"1"
# Generous: a busy 2-core host takes seconds just to import Prefect's settings.
DECISION_TIMEOUT_SECONDS = 60.0
STOP_GRACE_SECONDS = 5.0
PR_SET_PDEATHSIG = 1
# Where `prefect server start` (and `make serve`) listens by default.
DEFAULT_LOCAL_API_URL = "http://127.0.0.1:4200/api"
DEFAULT_LOCAL_PORT = 4200
# A local server answers /health in milliseconds; a refused port fails at once. Bounded for a busy host.
PROBE_TIMEOUT_SECONDS = 1.0
# How long a configured API gets to answer `GET /health` before any flow runs: a server that is up answers in
# milliseconds (a loaded one in well under a second); one that has not answered in this long is hung.
API_ANSWER_SECONDS = 10.0
# Prefect's own default is 60 s per request (times 6 with its retries): a hung API then holds a command for
# 7 minutes per request. 30 s is still far beyond what any request of a flow run takes on a loaded server.
API_REQUEST_TIMEOUT_SECONDS = 30.0


class TempServerError(RuntimeError):
    pass


@dataclass
class TempServer:
    """Our child process serving Prefect's API on `api_url`."""

    process: subprocess.Popen[bytes]
    api_url: str
    lifeline: int  # write end; this process dying closes it, and the server follows

    def stop(self) -> None:
        """Stop and reap the server; safe to call more than once (atexit, tests)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.lifeline >= 0:
            os.close(self.lifeline)
            self.lifeline = -1


# ---------------------------------------------------------------------------------------------
# The CLI side.


def start_for_cli(argv: Sequence[str], environ: MutableMapping[str, str] = os.environ) -> TempServer | None:
    """Called first in `main()`: start our temporary server when Prefect would start its own. Never raises."""
    if not needs_temp_server(argv, environ):
        return None
    # A server of this user already running where `prefect server start` listens (`make serve`): use it, start
    # none. Only when nothing is configured anywhere, so a configured server is never overridden.
    if _nothing_configured(environ):
        owners = listener_uids(DEFAULT_LOCAL_PORT)
        if owners and set(owners) == {os.getuid()}:
            if reachable(DEFAULT_LOCAL_API_URL):
                environ["PREFECT_API_URL"] = DEFAULT_LOCAL_API_URL
                print(f"relaunch: using your Prefect server at {DEFAULT_LOCAL_API_URL}", file=sys.stderr)
                return None
        elif owners or (owners is None and reachable(DEFAULT_LOCAL_API_URL)):
            print(_not_yours(owners), file=sys.stderr)
    try:
        server = start(environ)
    except Exception as exc:  # noqa: BLE001 - any trouble here must leave the CLI working as before
        print(
            f"relaunch: warning: no self-stopping temporary Prefect server ({exc}); Prefect starts its own, which outlives a killed relaunch",
            file=sys.stderr,
        )
        return None
    if server is None:
        return None
    environ["PREFECT_API_URL"] = server.api_url
    # Registered before Prefect is imported, so it runs after Prefect's own exit hooks have flushed logs and events.
    atexit.register(server.stop)
    return server


def needs_temp_server(argv: Sequence[str], environ: MutableMapping[str, str]) -> bool:
    """Cheap checks only: Prefect is not imported here (its settings are read once, at import)."""
    if os.name != "posix" or environ.get("PREFECT_API_URL"):
        return False
    return runs_flow(argv) and not _profile_sets_api_url(environ)


def runs_flow(argv: Sequence[str]) -> bool:
    """Whether this command line runs a Prefect flow (and so needs an API and Prefect's imports)."""
    command = command_of(argv)
    if "--help" in argv or (command == "recover" and "--dry-run" in argv):
        return False  # help, or the dry run's printout of the host commands
    return command in FLOW_COMMANDS


# Environment settings that change where Prefect finds its API, or whether it may start a temporary one.
_API_SETTINGS = ("PREFECT_API_URL", "PREFECT_PROFILE", "PREFECT_SERVER_EPHEMERAL_ENABLED", "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE")
# Files in the working directory Prefect reads settings from, and what marks Prefect settings in each.
_SETTINGS_FILES = {".env": "PREFECT_", "prefect.toml": "", "pyproject.toml": "tool.prefect"}


def _nothing_configured(environ: MutableMapping[str, str]) -> bool:
    """Sure that no API URL is configured anywhere Prefect looks (and its temporary server is allowed).

    Conservative: any settings file in the working directory, any such variable, or a profile with settings
    of its own answers False, and then nothing is probed: Prefect's own resolution (in the server child) decides.
    """
    if any(environ.get(name) for name in _API_SETTINGS) or any(_has_settings(name, mark) for name, mark in _SETTINGS_FILES.items()):
        return False
    profiles = _profiles_path(environ)
    if not profiles.exists():
        return True  # Prefect's packaged default: the `ephemeral` profile
    try:
        data = tomllib.loads(profiles.read_text())
    except (OSError, ValueError):
        return False
    table = data.get("profiles")
    active = data.get("active", "ephemeral")
    profile = table.get(active, {}) if isinstance(table, dict) else {}
    allowed = {"PREFECT_SERVER_ALLOW_EPHEMERAL_MODE", "PREFECT_SERVER_EPHEMERAL_ENABLED"}
    return (
        active == "ephemeral"
        and isinstance(profile, dict)
        and set(profile) <= allowed
        and all(str(v).lower() == "true" for v in profile.values())
    )


def _has_settings(name: str, mark: str) -> bool:
    try:
        return mark.lower() in Path(name).read_text(errors="replace").lower()
    except FileNotFoundError:
        return False
    except OSError:
        return True  # unreadable: cannot tell, so not sure nothing is configured


def _profiles_path(environ: MutableMapping[str, str]) -> Path:
    home = Path(environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
    return Path(environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()


def _profile_sets_api_url(environ: MutableMapping[str, str]) -> bool:
    """A shortcut for `prefect config set PREFECT_API_URL=...`, saving the ~1 s the server child needs to decide.

    A reading of Prefect's profiles file, not Prefect's full resolution: a miss (prefect.toml, .env)
    still ends in the child's exact check; a wrong hit only leaves Prefect's own behaviour.
    """
    try:
        profiles = tomllib.loads(_profiles_path(environ).read_text())
    except (OSError, ValueError):
        return False
    active = environ.get("PREFECT_PROFILE") or profiles.get("active")
    table = profiles.get("profiles")
    profile = table.get(active) if isinstance(table, dict) and isinstance(active, str) else None
    return isinstance(profile, dict) and bool(profile.get("PREFECT_API_URL"))


def _not_yours(owners: list[int] | None) -> str:
    whose = (
        "whose owner cannot be read here (no /proc/net/tcp)"
        if owners is None
        else f"owned by uid {', '.join(str(u) for u in sorted(set(owners)))}, not by you (uid {os.getuid()})"
    )
    return (
        f"relaunch: not using the server on 127.0.0.1:{DEFAULT_LOCAL_PORT}, {whose}: it may be another person's; "
        "this command runs on a temporary Prefect server of its own.\n"
        "  to use a Prefect server: export PREFECT_API_URL=http://HOST:PORT/api (or `prefect config set PREFECT_API_URL=...`)"
    )


# /proc/net/tcp{,6} `st` of a listening socket (TCP_LISTEN).
_LISTEN = "0A"
# Local addresses whose listener takes a connection to 127.0.0.1 (:: when dual-stack, which cannot be read here).
_TAKES_LOOPBACK = {"127.0.0.1", "0.0.0.0", "::", "::ffff:127.0.0.1"}


def listener_uids(port: int, proc_net: Path = Path("/proc/net")) -> list[int] | None:
    """The owner uid of each socket listening on PORT that a connection to 127.0.0.1:PORT can reach.

    [] when none listens; None when the kernel's tables cannot be read (not Linux), so nobody is known.
    The tables are this network namespace's, the one a connection from this process goes through.
    """
    found: list[int] = []
    readable = False
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = (proc_net / name).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[3] != _LISTEN:
                continue
            address, _, port_hex = fields[1].partition(":")
            if int(port_hex, 16) == port and _address(address, family) in _TAKES_LOOPBACK:
                found.append(int(fields[7]))
    return found if readable else None


def _address(hex_address: str, family: int) -> str:
    """/proc/net/tcp's address: 32-bit words printed in host byte order."""
    words = [int(hex_address[i : i + 8], 16) for i in range(0, len(hex_address), 8)]
    return socket.inet_ntop(family, b"".join(w.to_bytes(4, sys.byteorder) for w in words))


def api_client_defaults(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set PREFECT_API_REQUEST_TIMEOUT to API_REQUEST_TIMEOUT_SECONDS where the user has set it nowhere.

    Before Prefect reads its settings. An environment variable outranks Prefect's files, so it is set only when
    no file Prefect reads mentions the setting: the working folder's .env, prefect.toml, pyproject.toml, the
    active profile (conservative: a mention anywhere in them leaves Prefect's own resolution alone).
    """
    name = "PREFECT_API_REQUEST_TIMEOUT"
    if environ.get(name) or any(_mentions(f, ("request_timeout", name)) for f in _SETTINGS_FILES):
        return
    profile = _active_profile(environ)
    if profile is None or name in profile:
        return
    environ[name] = f"{API_REQUEST_TIMEOUT_SECONDS:g}"


def _mentions(name: str, words: tuple[str, ...]) -> bool:
    try:
        text = Path(name).read_text(errors="replace").lower()
    except FileNotFoundError:
        return False
    except OSError:
        return True  # unreadable: it may set it
    return any(word.lower() in text for word in words)


def _active_profile(environ: MutableMapping[str, str]) -> dict[str, object] | None:
    """The active profile's settings ({} for none), None when the profiles file cannot be read."""
    path = _profiles_path(environ)
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return None
    active = environ.get("PREFECT_PROFILE") or data.get("active") or "ephemeral"
    table = data.get("profiles")
    profile = table.get(active) if isinstance(table, dict) else None
    return profile if isinstance(profile, dict) else {}


def unanswered_api(api_url: str | None = None, timeout_seconds: float = API_ANSWER_SECONDS) -> str | None:
    """Why the command must end now (exit 3) because the configured API does not answer; None when it may go on.

    `GET {api}/health` through httpx, as Prefect's client sends its requests (its proxy variables, TLS
    settings), once, before any flow runs. Only a timeout stops the command: any HTTP answer means the server
    is alive, and a refused connection, an unknown name or a TLS failure fails Prefect's own first request at
    once, with its own message. Without API_URL, Prefect's resolved setting (profile, prefect.toml, ...) is read.
    """
    if api_url is None:
        api_url = configured_api_url()
    if not api_url:
        return None  # Prefect starts its own temporary server
    problem = api_health(api_url, timeout_seconds)
    if problem is None or not problem.timed_out:
        return None
    what = problem.what
    return (
        f"relaunch: the Prefect API at {api_url} {what}; nothing was done on any host.\n"
        "  what to do: see to that server (is it up, hung, overloaded? its log; `prefect server status`), or point "
        "PREFECT_API_URL at one that answers, or unset it (and any in your Prefect profile: `prefect config view`) "
        "to run this command on a temporary server of its own"
    )


def configured_api_url() -> str | None:
    """The API URL Prefect resolved from its settings (environment, profile, prefect.toml, ...); None: none is set."""
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


@dataclass(frozen=True)
class HealthProblem:
    what: str  # completes "the Prefect API at URL ..."
    timed_out: bool  # it never answered: a hung server (other failures come back at once, with Prefect's own message)


def api_health(api_url: str, timeout_seconds: float = API_ANSWER_SECONDS) -> HealthProblem | None:
    """Why `GET {api}/health` through httpx (as Prefect's client sends its requests: its proxy variables, TLS settings)
    got no healthy answer within timeout_seconds; None when it did."""
    import httpx

    health = f"{api_url.rstrip('/')}/health"
    try:
        response = httpx.get(health, timeout=timeout_seconds)
    except httpx.ConnectTimeout:
        return HealthProblem(f"did not accept a connection within {timeout_seconds:.0f} s", True)
    except httpx.TimeoutException:
        return HealthProblem(f"accepted the connection but did not answer GET {health} within {timeout_seconds:.0f} s", True)
    except httpx.HTTPError as exc:
        return HealthProblem(f"cannot be reached: {type(exc).__name__}: {exc}", False)
    if response.status_code != 200:
        return HealthProblem(f"answered GET {health} with HTTP {response.status_code} {response.reason_phrase}", False)
    return None


def reachable(api_url: str, timeout_seconds: float = PROBE_TIMEOUT_SECONDS) -> bool:
    """A Prefect API answers `GET {api_url}/health` with `true` (what Prefect's own client checks)."""
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(api_url)
    if url.scheme != "http" or not url.hostname:
        return False
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout_seconds)
    try:
        conn.request("GET", f"{url.path.rstrip('/')}/health")
        response = conn.getresponse()
        return response.status == 200 and response.read(64).strip() == b"true"
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand: the first argument that is not an option (`relaunch --debug check t.yaml` -> check)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def start(environ: MutableMapping[str, str]) -> TempServer | None:
    """Start the server child; None when Prefect would not start a temporary server here."""
    listener = _listen()
    port = listener.getsockname()[1]
    lifeline_r, lifeline_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        process = _spawn(environ, listener, lifeline_r, status_w)
    except BaseException:
        os.close(lifeline_w)
        os.close(status_r)
        raise
    finally:
        # The child has its copies. Ours must go: a dead child then refuses connections instead of
        # leaving them hanging, and only the write end keeps the child alive.
        listener.close()
        os.close(lifeline_r)
        os.close(status_w)
    server = TempServer(process, f"http://127.0.0.1:{port}/api", lifeline_w)
    try:
        go = _await_decision(status_r, process, server_log_path(environ))
    except BaseException:
        server.stop()
        raise
    finally:
        os.close(status_r)
    if not go:
        server.stop()
        return None
    return server


def _listen() -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    # Listening now, before the server boots: early requests queue in the backlog instead of being refused.
    listener.listen(2048)
    return listener


def server_log_path(environ: Mapping[str, str]) -> Path:
    """Where the temporary server's own output goes: its services' errors (an event flush that failed as the CLI
    exited, with its traceback) are the server's business, not the terminal's. PREFECT_HOME, else ~/.prefect."""
    home = Path(environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    return home / "relaunch-temporary-server.log"


def _spawn(environ: MutableMapping[str, str], listener: socket.socket, lifeline_r: int, status_w: int) -> subprocess.Popen[bytes]:
    fds = (listener.fileno(), lifeline_r, status_w)
    args = ["--parent", str(os.getpid()), "--socket-fd", str(fds[0]), "--lifeline-fd", str(fds[1]), "--status-fd", str(fds[2]), PREFECT_APP]
    log = server_log_path(environ)
    log.parent.mkdir(parents=True, exist_ok=True)
    # Same process group as the CLI, as with Prefect's own server: a Ctrl-C reaches both. Its output is appended to
    # its log (each start begins it anew), which a start-up failure quotes.
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "relaunch.cli.tempserver", *args],
            env={**environ, **SERVER_ENV},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=fds,
        )


def _log_tail(log: Path, lines: int = 15) -> str:
    """The server log's last lines, for an error that says why it did not start."""
    try:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n".join(["", f"its output ({log}), last lines:", *tail]) if tail else ""


def _await_decision(status_r: int, process: subprocess.Popen[bytes], log: Path) -> bool:
    ready, _, _ = select.select([status_r], [], [], DECISION_TIMEOUT_SECONDS)
    if not ready:
        raise TempServerError(f"the server did not answer within {DECISION_TIMEOUT_SECONDS:.0f} s{_log_tail(log)}")
    if os.read(status_r, 1) == GO:
        return True
    code = process.wait(STOP_GRACE_SECONDS)  # it closed the pipe by exiting
    if code == NOT_WANTED:
        return False
    raise TempServerError(f"the server exited with code {code}{_log_tail(log)}")


# ---------------------------------------------------------------------------------------------
# The server side: `python -m relaunch.cli.tempserver ...`, started by `_spawn`.


def serve(parent: int, socket_fd: int, lifeline_fd: int, status_fd: int, app: str) -> int:
    """Tie this process to `parent`, check Prefect wants a temporary server, then serve `app` on the socket."""
    if not _die_with(parent):
        return 1
    _watch_lifeline(lifeline_fd)
    if not _prefect_would_start_its_own():
        return NOT_WANTED
    import uvicorn

    os.write(status_fd, GO)
    os.close(status_fd)
    # The slow part (~3 s of imports, then the app) before uvicorn takes SIGTERM over: until then, a dying
    # parent's SIGTERM ends us at once. With the collector off: what they allocate lives as long as the server,
    # so the collections it would trigger free nothing (about a tenth of the boot's CPU); frozen after.
    module, _, factory = app.partition(":")
    gc.disable()
    try:
        asgi = getattr(importlib.import_module(module), factory)()
    finally:
        gc.freeze()
        gc.enable()
    # What Prefect's `python -m uvicorn --factory APP --log-level error --lifespan on` sets up, the factory called above.
    server = uvicorn.Server(uvicorn.Config(asgi, log_level="error", lifespan="on"))
    server.run(sockets=[socket.socket(fileno=socket_fd)])
    return 0 if server.started else STARTUP_FAILURE


def _die_with(parent: int) -> bool:
    """Linux: SIGTERM when the parent dies. False when it already has (we were re-parented)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the lifeline still stops us
    return os.getppid() == parent


def _watch_lifeline(fd: int) -> None:
    """On EOF (the parent is gone, or stopping us) shut down like a SIGTERMed uvicorn; exit hard if that hangs."""

    def watch() -> None:
        try:
            while os.read(fd, 1024):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_GRACE_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="relaunch-lifeline", daemon=True).start()


def _prefect_would_start_its_own() -> bool:
    """The test `prefect.client.orchestration.get_client` makes before starting SubprocessASGIServer."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    return not PREFECT_API_URL.value() and bool(PREFECT_SERVER_EPHEMERAL_ENABLED.value())


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m relaunch.cli.tempserver", description="A temporary Prefect API server that stops when its parent dies."
    )
    parser.add_argument("--parent", type=int, required=True, help="PID that must be our parent.")
    parser.add_argument("--socket-fd", type=int, required=True, help="Listening socket to serve on.")
    parser.add_argument("--lifeline-fd", type=int, required=True, help="Read end of a pipe; EOF stops the server.")
    parser.add_argument("--status-fd", type=int, required=True, help="Write end of a pipe; gets one byte once we serve.")
    parser.add_argument("app", help="ASGI app factory, module:function.")
    args = parser.parse_args(argv)
    return serve(args.parent, args.socket_fd, args.lifeline_fd, args.status_fd, args.app)


if __name__ == "__main__":
    sys.exit(_main())
