"""relaunch's overhead: `relaunch recover` against a bash script of the same steps, alternated in one run.

One demo target (demo/scenarios.py prepare, scenario fx-race) is broken the same way before every timed run,
then recovered by one of three contenders, in a rotating order each round:

- `bash`: bench/overhead_manual.sh, what a competent person types (uv venv + uv pip sync offline from the
  wheelhouse, git checkout, rm -rf + warm-up, tmux new-session, an `until grep` loop once a second);
- `relaunch-temp`: `.venv/bin/relaunch recover TARGET` with no Prefect server configured: relaunch starts its
  temporary one, as a new user gets it;
- `relaunch-server`: the same with PREFECT_API_URL pointing at a `prefect server start` this bench runs;
- `relaunch-agent`: the same again, through a `relaunch agent start`ed once before the rounds (relaunch/cli/agent.py:
  Prefect and the flows already imported, the command forked with the caller's environment).
Every contender but the agent's runs with RELAUNCH_AGENT=off, and the agent lives in a folder of the bench's own.

Two cases:
- `full`: the fx-race breakage (venv drifted to tinyattn 1.1, model.py hacked, stale cache, the trainer
  crashed of the FX race); relaunch's playbook answers with the full procedure (stop, rebuild_venv,
  restore_code, warm_cache, launch);
- `relaunch`: the trainer SIGKILLed mid-run (the supervisor records 137); relaunch stops and relaunches from
  the newest checkpoint, as the script does.

Each timed run ends when the new trainer has printed 5 step lines (the demo's healthy_steps): the script
greps for them, relaunch's health check counts them (and also checks throughput, loss and the PID on the
same polls: no extra wait). Wall time from process start to exit, from a shell environment without
PREFECT_* variables. Breaking the target again between runs is not timed.

    .venv/bin/python bench/record.py overhead -- .venv/bin/python bench/overhead.py [--rounds 5] [--cases full,relaunch]
        [--contenders bash,relaunch-temp,relaunch-server,relaunch-agent]

Prints a summary on stderr and the JSON on stdout. Medians and p95 (nearest rank) from bench/stats.py;
the ratios are relaunch's median over the script's median, and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
VENV_BIN = Path(sys.executable).parent
os.environ["PATH"] = f"{VENV_BIN}:{os.environ['PATH']}"
os.environ.setdefault("DO_NOT_TRACK", "1")

from bench.stats import P95_METHOD, machine, summary  # noqa: E402

SESSION = "relaunch-bench-overhead"
MANUAL = ROOT / "bench" / "overhead_manual.sh"
CONTENDERS = ("bash", "relaunch-temp", "relaunch-server", "relaunch-agent")
# With --baseline DIR: the same two runs of an older relaunch, for a before/after in the same alternation.
BASELINES = ("relaunch-temp-baseline", "relaunch-server-baseline")
EXPECTED_ACTION = {"full": "full_recovery", "relaunch": "relaunch"}
SERVER_BOOT_SECONDS = 180


def log(message: str) -> None:
    print(f"[overhead] {message}", file=sys.stderr, flush=True)


# The bench's own agent folder (XDG_RUNTIME_DIR), made at first use: a user's agent is never timed, and ours
# serves nobody else.
_AGENT_RUNTIME: list[Path] = []


def agent_runtime() -> Path:
    if not _AGENT_RUNTIME:
        _AGENT_RUNTIME.append(Path(tempfile.mkdtemp(prefix="relaunch-bench-agent-")))
    return _AGENT_RUNTIME[0]


def user_env(api_url: str | None, agent: bool = False) -> dict[str, str]:
    """A user's shell: no Prefect settings of ours leak in; the venv's bin on PATH (uv, relaunch)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k not in ("DO_NOT_TRACK", "RELAUNCH_AGENT")}
    env["PATH"] = f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin"
    env["XDG_RUNTIME_DIR"] = str(agent_runtime())
    env["RELAUNCH_AGENT"] = "on" if agent else "off"
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


@contextmanager
def relaunch_agent() -> Iterator[None]:
    """`relaunch agent start` once, as a user would before a night of recoveries; stopped at the end."""
    started = subprocess.run([str(VENV_BIN / "relaunch"), "agent", "start"], env=user_env(None, agent=True), capture_output=True, text=True)
    if started.returncode != 0:
        raise SystemExit(f"relaunch agent start failed: {started.stdout}{started.stderr}")
    log(started.stdout.strip())
    try:
        yield
    finally:
        subprocess.run([str(VENV_BIN / "relaunch"), "agent", "stop"], env=user_env(None, agent=True), capture_output=True, text=True)
        shutil.rmtree(agent_runtime(), ignore_errors=True)


# ---- a running Prefect server -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def prefect_server(home: Path) -> Iterator[str]:
    """`prefect server start` on a free port with its own PREFECT_HOME; stopped (its process group) at the end."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**user_env(None), "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    out = open(home.parent / "prefect-server.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [str(VENV_BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + SERVER_BOOT_SECONDS
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=5).read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"prefect server start did not come up: see {out.name}") from None
                time.sleep(0.2)
        log(f"prefect server running at {url}")
        yield url
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        out.close()


# ---- breaking the target the same way before every run (not timed) -------------------------------


def stop_everything(target: Any) -> None:
    """The trainer by relaunch's records, and whatever the script started in the session."""
    from relaunch.plans.stop import plan_stop
    from relaunch.wire.transport import run, transport_for

    panes = subprocess.run(["tmux", "list-panes", "-t", f"={SESSION}", "-F", "#{pane_pid}"], capture_output=True, text=True)
    for pid in panes.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["tmux", "kill-session", "-t", f"={SESSION}"], capture_output=True)
    run(transport_for(target.host), plan_stop(target, 20), check=False)


def wait_for(target: Any, what: str, done: Callable[[Any], bool], timeout_seconds: float = 300) -> None:
    from relaunch.tasks.health import collect_snapshot

    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if done(collect_snapshot(target, wait_seconds=0.5)):
            return
    raise SystemExit(f"overhead: the target never reached '{what}' within {timeout_seconds:.0f} s")


def break_full(target: Any) -> None:
    """What the fx-race scenario does: drifted venv, hacked model file, stale cache, the broken run crashed."""
    from relaunch.demo.scenarios import DEBUG_HACK
    from relaunch.tasks.launch import launch
    from relaunch.wire.transport import local_env

    stop_everything(target)
    links = [a for d in target.find_links for a in ("--find-links", d)]
    subprocess.run(
        [
            "uv",
            "pip",
            "install",
            "-q",
            "--python",
            f"{target.venv_dir}/bin/python",
            "--no-index",
            *links,
            "tinyattn==1.1.0",
            "tinyjunk==0.1.0",
        ],
        check=True,
        env=local_env(),
    )
    model = Path(target.repo_dir) / "model.py"
    model.write_text(model.read_text().replace(*DEBUG_HACK, 1))
    stale = Path(target.inductor_cache_dir) / "zz"
    stale.mkdir(parents=True, exist_ok=True)
    (stale / "czzstale.so").write_bytes(b"stale kernel from another torch build\n")
    launch.fn(target, 0)
    wait_for(target, "the broken run's exit", lambda s: s.exit_code is not None)


def break_relaunch(target: Any) -> None:
    """A healthy run, SIGKILLed (the trainer alone) once it steps; waits for the supervisor's exit record."""
    from relaunch import runlayout
    from relaunch.tasks.launch import launch

    stop_everything(target)
    detail, _ = launch.fn(target, 0)
    wait_for(target, "3 step lines", lambda s: sum(line.startswith("step=") for line in s.log_tail) >= 3 or s.exit_code is not None)
    pid = int(Path(runlayout.record(target.state_path, detail.run_id, runlayout.PID)).read_text().split()[0])
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        raise SystemExit(f"overhead: the run to kill had already exited; see {detail.log_path}") from None
    wait_for(target, "the killed run's exit record", lambda s: s.exit_code is not None)


BREAK: dict[str, Callable[[Any], None]] = {"full": break_full, "relaunch": break_relaunch}


# ---- the timed runs ---------------------------------------------------------------------------------


def time_bash(case: str, target: Any, work: Path, out: Path) -> dict[str, Any]:
    argv = ["bash", str(MANUAL), case, str(work), SESSION, target.python, *target.find_links]
    start = time.monotonic()
    proc = subprocess.run(argv, env=user_env(None), capture_output=True, text=True)
    seconds = time.monotonic() - start
    out.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"overhead: the script failed ({proc.returncode}); see {out}:\n{proc.stderr[-2000:]}")
    phases = {line.split()[1]: int(line.split()[2]) / 1000 for line in proc.stderr.splitlines() if line.startswith("phase ")}
    return {"seconds": round(seconds, 3), "phases_seconds": phases}


def time_relaunch(
    case: str, target_file: Path, api_url: str | None, out: Path, baseline: Path | None = None, agent: bool = False
) -> dict[str, Any]:
    argv = [str(VENV_BIN / "relaunch"), "recover", str(target_file), "--json"]
    env, cwd = user_env(api_url, agent), ROOT
    if baseline:
        cwd = baseline  # `python -m` puts the working directory first on sys.path
        # An older relaunch tree (`git archive REF relaunch tasks flows | tar -x -C DIR`) ahead of this checkout.
        argv[0:1] = [sys.executable, "-m", "relaunch.cli"]
        env["PYTHONPATH"] = str(baseline)
    started_at, start = time.time(), time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=cwd)
    seconds = time.monotonic() - start
    out.write_text(proc.stdout + "\n----- stderr\n" + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"overhead: relaunch recover exited {proc.returncode}; see {out}:\n{proc.stderr[-2000:]}")
    report = json.loads(proc.stdout)
    first, last = report["attempts"][0], report["attempts"][-1]
    if first["action"] != EXPECTED_ACTION[case] or last["verdict"] != "healthy":
        raise SystemExit(
            f"overhead: relaunch did {first['action']} -> {last['verdict']}, not {EXPECTED_ACTION[case]} -> healthy; see {out}"
        )
    steps = {s["step"]: s["seconds"] for a in report["attempts"] for s in a["steps"]}
    return {
        "seconds": round(seconds, 3),
        "steps_seconds": steps,
        "steps_seen": last["metrics"]["steps_seen"],
        "phases_seconds": phases_of(proc.stderr, started_at),
    }


def phases_of(stderr: str, started_at: float) -> dict[str, float]:
    """Seconds from process start to the flow's first log line, the launch step's end and the healthy verdict (log stamps)."""
    import datetime as dt

    day = dt.datetime.fromtimestamp(started_at).date()
    marks = {"flow_begins": "Beginning flow run", "launch": "Task run 'launch@", "healthy": ": healthy ("}
    found: dict[str, float] = {}
    for line in stderr.splitlines():
        for name, text in marks.items():
            if text in line and (name != "launch" or "Finished in state" in line):
                try:
                    clock = dt.datetime.strptime(line[:12], "%H:%M:%S.%f").time()
                except ValueError:
                    continue
                found[name] = round(dt.datetime.combine(day, clock).timestamp() - started_at, 3)
    return found


def run_case(
    case: str,
    rounds: int,
    target: Any,
    target_file: Path,
    work: Path,
    api_url: str,
    outputs: Path,
    baseline: Path | None,
    contenders: tuple[str, ...] = CONTENDERS,
) -> dict[str, Any]:
    contenders = contenders + (BASELINES if baseline else ())
    samples: dict[str, list[dict[str, Any]]] = {c: [] for c in contenders}
    if case == "relaunch":
        # The prepared target is broken (fx-race): put it right once, untimed, by the script's full procedure.
        time_bash("full", target, work, outputs / "relaunch-setup.txt")
    for number in range(rounds):
        order = contenders[number % len(contenders) :] + contenders[: number % len(contenders)]
        for contender in order:
            BREAK[case](target)
            out = outputs / f"{case}-{number}-{contender}.txt"
            if contender == "bash":
                sample = time_bash(case, target, work, out)
            else:
                server = None if contender.startswith("relaunch-temp") else api_url
                agent = contender == "relaunch-agent"
                sample = time_relaunch(case, target_file, server, out, baseline if contender in BASELINES else None, agent)
            sample["load_average_1m"] = round(os.getloadavg()[0], 2)
            samples[contender].append(sample)
            log(f"{case} round {number + 1}/{rounds} {contender:<16} {sample['seconds']:6.2f} s (load {sample['load_average_1m']})")
    stop_everything(target)
    bash = [s["seconds"] for s in samples["bash"]]
    result: dict[str, Any] = {"summary": {c: summary([s["seconds"] for s in samples[c]], unit="seconds") for c in contenders}}
    for contender in contenders[1:]:
        mine = [s["seconds"] for s in samples[contender]]
        result[f"ratio_{contender}"] = {
            "of_medians": round(statistics.median(mine) / statistics.median(bash), 3),
            "median_of_rounds": round(statistics.median(m / b for m, b in zip(mine, bash, strict=True)), 3),
            "per_round": [round(m / b, 3) for m, b in zip(mine, bash, strict=True)],
        }
    # Where the time goes, medians: start to launch (the trainer started), launch to the 5th step line seen, then exit.
    result["phases_median_seconds"] = {c: phase_medians(samples[c]) for c in contenders}
    result["samples"] = samples
    return result


def phase_medians(samples: list[dict[str, Any]]) -> dict[str, float]:
    rows = [s for s in samples if {"launch", "healthy"} <= set(s.get("phases_seconds", {}))]
    if not rows:
        return {}
    launch = [s["phases_seconds"]["launch"] for s in rows]
    healthy = [s["phases_seconds"]["healthy"] for s in rows]
    return {
        "to_launch": round(statistics.median(launch), 2),
        "launch_to_healthy": round(statistics.median(h - la for h, la in zip(healthy, launch, strict=True)), 2),
        "healthy_to_exit": round(statistics.median(s["seconds"] - s["phases_seconds"]["healthy"] for s in rows), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="Timed runs per contender and case.")
    parser.add_argument("--cases", default="full,relaunch", help="full, relaunch or both (comma-separated).")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="Which of them (comma-separated; bash always).")
    parser.add_argument("--workdir", type=Path, help="Keep the target, outputs and server log here (default: a temp folder, removed).")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="An older relaunch tree (git archive REF relaunch tasks flows) to time as well, as the `-baseline` runs.",
    )
    args = parser.parse_args()
    # Started in the background (SIGINT ignored) or stopped by a harness: SIGTERM still runs the clean-up below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cases = [c for c in args.cases.split(",") if c]
    if not set(cases) <= set(BREAK):
        parser.error(f"cases are {', '.join(BREAK)}")
    chosen = {c for c in args.contenders.split(",") if c} | {"bash"}
    if not chosen <= set(CONTENDERS):
        parser.error(f"contenders are {', '.join(CONTENDERS)}")
    contenders = tuple(c for c in CONTENDERS if c in chosen)

    from relaunch.cli.tempserver import DEFAULT_LOCAL_API_URL, reachable
    from relaunch.demo.scenarios import prepare

    tmp = args.workdir or Path(tempfile.mkdtemp(prefix="relaunch-bench-overhead-"))
    tmp.mkdir(parents=True, exist_ok=True)
    work, outputs = tmp / "target", tmp / "outputs"
    outputs.mkdir(exist_ok=True)
    before = machine()
    if reachable(DEFAULT_LOCAL_API_URL):
        raise SystemExit(f"a Prefect server answers at {DEFAULT_LOCAL_API_URL}: relaunch-temp would use it; stop it first")
    try:
        log(f"preparing the fx-race demo target in {work}")
        target = prepare("fx-race", work, name=SESSION)
        import yaml

        target_file = tmp / "target.yaml"
        target_file.write_text(yaml.safe_dump(target.model_dump(mode="json", exclude_defaults=True), sort_keys=False))
        results: dict[str, Any] = {}
        with prefect_server(tmp / "prefect-home") as api_url, relaunch_agent():
            for case in cases:
                results[case] = run_case(case, args.rounds, target, target_file, work, api_url, outputs, args.baseline, contenders)
    finally:
        with_target = "target" in locals()
        if with_target:
            stop_everything(target)
        if args.workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    print_summary(results)
    print(
        json.dumps(
            {
                "what": "wall seconds of one recovery of the demo target, from process start to exit, by a bash script of the same steps and by `relaunch recover` (with no server: its temporary one; with a running `prefect server start`; with that server and a running `relaunch agent`), alternated in one run",
                "p95_method": P95_METHOD,
                "rounds": args.rounds,
                "baseline": str(args.baseline) if args.baseline else None,
                "machine_before": before,
                "machine_after": machine(),
                "evidence": "both end once the new trainer has printed 5 step lines (the demo's healthy_steps); relaunch also checks throughput, loss and the PID on the same polls",
                "relaunch_does_more": [
                    "preflight (tools, repo, ref, lock, disk) and the target's lock",
                    "stop_leftovers: reaps host commands a killed orchestrator left",
                    "a health check before acting (the verdict chooses the playbook action)",
                    "full: venv drift report, freeze compared with the lock, import check of torch/tinyattn/model, the restored files' diff saved as a patch, cache size",
                    "run records (PID, start time, exit code) through a supervisor; a per-attempt log",
                    "Prefect: flow and task runs, logs, events, artifacts in the server",
                ],
                "goal_ratio": 1.1,
                "cases": results,
            },
            indent=2,
        )
    )


def print_summary(results: dict[str, Any]) -> None:
    for case, r in results.items():
        s = r["summary"]
        line = f"{case:<9} bash {s['bash']['median_seconds']:.2f} s"
        for contender in [c for c in s if c != "bash"]:
            ratio = r[f"ratio_{contender}"]
            line += f" | {contender} {s[contender]['median_seconds']:.2f} s ({ratio['of_medians']:.2f}x, per-round median {ratio['median_of_rounds']:.2f}x)"
        log(line)


if __name__ == "__main__":
    main()
