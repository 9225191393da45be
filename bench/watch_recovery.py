"""A killed demo trainer, watched by `relaunch watch`, back to healthy: against the same trainer started by hand.

    python bench/watch_recovery.py [--device cpu|cuda] [--kills N] [--hand-runs N] [--hand-runs-after N] [--interval-seconds 10]
                                   [--workdir DIR] [--progress FILE]

One run, one warm torch.compile cache. The demo's healthy scenario target (relaunch.demo.scenarios.prepare: the
compiled flex_attention trainer) is recovered once by recover-training (venv rebuilt, code restored, cache warmed,
trainer launched until healthy), then stopped. Then:
(a) by hand: the target's launch command exactly, in a tmux session of its own, with the venv's bin first on PATH and
    the trainer's environment (relaunch.plans.launch.trainer_env: the same TORCHINDUCTOR_CACHE_DIR); seconds from the
    `tmux new-session` to the log's Target.healthy_steps-th step line, --hand-runs times (its process group
    SIGKILLed after each);
(b) relaunched: launched by relaunch, watched by flows/watch.Watch at --interval-seconds (its own thread, a temporary
    Prefect server), its trainer's process group (the supervisor's) SIGKILLed --kills times, each once a held look is
    out on it and it has written a newer checkpoint: seconds from the SIGKILL to the watch's "died" hand-over, to the
    recovery's healthy verdict (the last attempt's observation), and to the recovery's return; each with the
    recovery's own phases (first check, each step, launch to verdict, verdict to return).
--hand-runs-after more hand runs follow the kills (the same cache and page cache after them). Target: kill->healthy <= hand + 2 s.
Prints one JSON line (bench/record.py keeps it); with --progress, each sample is appended to FILE as it comes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _flow_env import ROOT  # noqa: E402,F401 - first: the environment Prefect is imported into

from relaunch import runlayout  # noqa: E402
from relaunch.config import Target  # noqa: E402
from relaunch.demo.scenarios import prepare, say  # noqa: E402
from relaunch.demo.target import resolve_device  # noqa: E402
from relaunch.plans.launch import trainer_env  # noqa: E402
from relaunch.records.report import Report  # noqa: E402
from relaunch.testing.targets import current, tmux_alive  # noqa: E402

FIRST_STEP = re.compile(r"first step in (?P<loop>[\d.]+) s, (?P<process>[\d.]+) s after the process started")
SLACK_SECONDS = 2.0


class Progress:
    """Each sample as one JSON line in FILE as it comes (a run cut short keeps what it measured)."""

    def __init__(self, path: Path | None):
        self.path = path

    def __call__(self, kind: str, row: dict[str, object]) -> None:
        say(f"{kind}: {json.dumps(row)}")
        if self.path:
            with self.path.open("a") as f:
                f.write(json.dumps({"kind": kind, **row}) + "\n")


def wait_for(what: str, done, timeout_seconds: float, nap: float = 0.02):
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        value = done()
        if value:
            return value
        time.sleep(nap)
    raise SystemExit(f"watch_recovery: {what} not within {timeout_seconds:.0f} s")


def group_members(pgid: int) -> list[int]:
    """Live processes (zombies left out) of the process group."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def step_lines(log: Path, pattern: re.Pattern[str]) -> int:
    try:
        return sum(1 for line in log.read_text(errors="replace").splitlines() if pattern.search(line))
    except FileNotFoundError:
        return 0


def process_first_step(log: Path) -> float | None:
    """The trainer's own `first step in X s, Y s after the process started`: Y."""
    found = FIRST_STEP.search(log.read_text(errors="replace")) if log.exists() else None
    return float(found["process"]) if found else None


def by_hand(target: Target, index: int) -> dict[str, object]:
    """The launch command started as a person would in tmux (no relaunch in between): seconds to the Nth step line."""
    session, log = f"{target.tmux_session}-by-hand", Path(target.log_dir) / f"by-hand-{index}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**trainer_env(target), "PATH": f"{target.venv_dir}/bin:{os.environ['PATH']}"}
    shell = f"{target.launch_command} > {shlex.quote(str(log))} 2>&1"
    argv = ["tmux", "new-session", "-d", "-s", session, "-c", target.repo_dir, "env", *(f"{k}={v}" for k, v in env.items())]
    pattern, steps = re.compile(target.thresholds.step_pattern), target.thresholds.healthy_steps
    start = time.monotonic()
    subprocess.run([*argv, "bash", "-c", shell], check=True)
    pane = int(
        subprocess.run(["tmux", "list-panes", "-t", f"={session}", "-F", "#{pane_pid}"], capture_output=True, text=True).stdout.split()[0]
    )
    try:
        wait_for(
            f"step line {steps} of the trainer started by hand",
            lambda: step_lines(log, pattern) >= steps,
            target.thresholds.startup_grace_seconds,
        )
        seconds = time.monotonic() - start
    finally:
        os.killpg(pane, signal.SIGKILL)  # the pane's process leads its group: the trainer and any compile workers
        subprocess.run(["tmux", "kill-session", "-t", f"={session}"], capture_output=True)
        wait_for("the trainer started by hand gone", lambda: not group_members(pane) and not tmux_alive(session), 60)
    return {"run": index, "nth_step_seconds": round(seconds, 2), "process_first_step_seconds": process_first_step(log)}


def newest_checkpoint_mtime(target: Target) -> float:
    return max((p.stat().st_mtime for p in Path(target.checkpoint_dir or "").glob("step_*.pt")), default=0.0)


def at(when: datetime | None) -> float | None:
    return when.timestamp() if when else None


def phases(report: Report, died_wall: float, returned_wall: float, kill_wall: float) -> dict[str, object]:
    """Where the recovery's time went, from its report: the first check, each step, the launched run's check."""
    first, last = report.attempts[0], report.attempts[-1]
    first_at, last_at = at(first.observation.at if first.observation else None), at(last.observation.at if last.observation else None)
    steps = [{"step": s.step.value, "seconds": round(s.seconds, 2)} for a in report.attempts for s in a.steps]
    seen = last.observation

    def r(value: float | None) -> float | None:
        return None if value is None else round(value, 2)

    return {
        "handover_to_first_verdict_seconds": round(first_at - died_wall, 2) if first_at else None,
        "steps": steps,
        "steps_seconds": round(sum(s["seconds"] for s in steps), 2),
        "launch_to_healthy_verdict_seconds": r(seen.seconds_since_launch) if seen else None,
        "launch_to_first_step_seen_seconds": r(seen.first_step_seconds) if seen else None,
        "launch_to_last_step_seen_seconds": r(seen.last_step_seconds) if seen else None,
        "verdict_to_return_seconds": round(returned_wall - last_at, 2) if last_at else None,
        "kill_to_healthy_verdict_seconds": round(last_at - kill_wall, 2) if last_at else None,
    }


class Kills:
    """The watch over the target in its own thread, and the kills of its trainer."""

    def __init__(self, target: Target, interval_seconds: float):
        from relaunch.flows.watch import Watch

        self.target, self.lines = target, []
        self.died = threading.Event()
        self.died_at = (0.0, 0.0)
        self.watch = Watch([], self.heard, targets=[target])
        self.runner = threading.Thread(target=self.watch.run, args=(interval_seconds,), daemon=True)

    def heard(self, line: str) -> None:
        if " died, exit code " in line:
            self.died_at = (time.monotonic(), time.time())
            self.died.set()
        self.lines.append(line)

    def once(self, index: int, since_wall: float) -> dict[str, object]:
        w = self.watch.watched[self.target.name]
        # A held look out on the run as it is now (a kill is heard within a nap), and a checkpoint newer than the
        # last recovery's end: the run trained on, so the kills are no restart storm.
        wait_for("a newer checkpoint", lambda: newest_checkpoint_mtime(self.target) > since_wall, 300, nap=0.1)
        wait_for("a held look out on the running trainer", lambda: w.recovery is None and w.looking is not None, 120)
        run_id = current(self.target)
        pid = int(Path(runlayout.record(self.target.state_path, run_id, runlayout.PID)).read_text().split()[0])
        pgid = os.getpgid(pid)
        self.died.clear()
        cpu_before = relaunch_cpu()
        kill_wall, start = time.time(), time.monotonic()
        os.killpg(pgid, signal.SIGKILL)
        if not self.died.wait(120):
            raise SystemExit(f"watch_recovery: no hand-over within 120 s of the kill; the watch said: {self.lines[-5:]}")
        handed = self.died_at[0] - start
        future: Future[Report] = wait_for("the recovery started", lambda: w.recovery, 30, nap=0.001)
        returned: list[float] = []
        future.add_done_callback(lambda _: returned.append(time.time()))
        report = future.result(timeout=900)
        cpu_after = relaunch_cpu()
        wait_for("the recovery's end recorded", lambda: returned, 5, nap=0.001)
        ok = report.ok and report.verdict is not None and report.verdict.value == "healthy"
        relaunched = Path(runlayout.record(self.target.state_path, current(self.target), runlayout.LOG_PATH)).read_text().strip()
        where = phases(report, self.died_at[1], returned[0], kill_wall)
        return {
            "kill": index,
            "run_killed": run_id,
            "killed_group": pgid,
            "handed_over_seconds": round(handed, 2),
            "healthy_seconds": where.pop("kill_to_healthy_verdict_seconds"),
            "recovery_returned_seconds": round(returned[0] - kill_wall, 2),
            "ends": report.headline(),
            "ok": ok,
            "process_first_step_seconds": process_first_step(Path(relaunched)),
            "phases": where,
            # CPU seconds relaunch spent from the kill to the recovery's return, on the cores the trainer starts on.
            "relaunch_cpu_seconds": {k: round(cpu_after[k] - cpu_before[k], 2) for k in cpu_before},
        }


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (its threads too), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_pids() -> list[int]:
    """The temporary Prefect server's processes: this process's descendants that are not the trainer's (no tmux)."""
    out, todo = [], [os.getpid()]
    while todo:
        parent = todo.pop()
        for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
            out.append(int(child))
            todo.append(int(child))
    server = (b"prefect", b"uvicorn")
    return [pid for pid in out if any(word in Path(f"/proc/{pid}/cmdline").read_bytes() for word in server)]


def relaunch_cpu() -> dict[str, float]:
    """CPU seconds so far of what relaunch runs beside the trainer: this process (the watch and the recovery flow's
    threads), the host commands it ran and reaped (the polls, the stop, the launch), and the Prefect server."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    server = 0.0
    for pid in server_pids():
        try:
            server += cpu_seconds(pid)
        except OSError:
            pass
    return {"flow": me.ru_utime + me.ru_stime, "host_commands": kids.ru_utime + kids.ru_stime, "server": server}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda where torch sees a GPU")
    p.add_argument("--kills", type=int, help="default: 5 on the CPU, 3 on a GPU")
    p.add_argument("--hand-runs", type=int, help="hand starts before the kills; default: --kills - 1")
    p.add_argument("--hand-runs-after", type=int, default=1, help="hand starts after the kills (the caches as warm as theirs)")
    p.add_argument("--interval-seconds", type=float, default=10.0)
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "relaunch-watch-recovery")
    p.add_argument("--progress", type=Path, help="append each sample to this file as one JSON line")
    a = p.parse_args()
    device = resolve_device(a.device)
    kills = a.kills or (5 if device == "cpu" else 3)
    hand_runs = kills - 1 if a.hand_runs is None else a.hand_runs
    note = Progress(a.progress)
    from prefect.testing.utilities import prefect_test_harness

    from bench.stats import machine, summary
    from bench.warmup_efficacy import environment
    from relaunch.flows.recover import recover_training
    from relaunch.tasks.launch import launch
    from relaunch.tasks.stop import stop

    before = machine()
    hand, relaunched = [], []
    t0 = time.monotonic()
    with prefect_test_harness(server_startup_timeout=120):
        target = prepare("healthy", a.workdir / "healthy", name="relaunch-watch-recovery", device=device)
        try:
            start = time.monotonic()
            warm = recover_training(target)  # venv rebuilt, cache warmed, trainer launched: the cache every start below reads
            note(
                "warm_up",
                {
                    "seconds": round(time.monotonic() - start, 1),
                    "ends": warm.headline(),
                    "steps": [s.step.value for x in warm.attempts for s in x.steps],
                },
            )
            if not warm.ok:
                raise SystemExit(f"watch_recovery: the first recovery ended {warm.headline()}")
            stop.fn(target)
            for i in range(1, hand_runs + 1):
                hand.append(by_hand(target, i))
                note("by_hand", hand[-1])
            launch.fn(target, 1)
            since = time.time()
            kills_ = Kills(target, a.interval_seconds)
            kills_.runner.start()
            try:
                for i in range(1, kills + 1):
                    relaunched.append(kills_.once(i, since))
                    since = time.time()
                    note("kill", relaunched[-1])
            finally:
                kills_.watch.stopping.set()
                kills_.runner.join(600)
            stop.fn(target)
            for i in range(hand_runs + 1, hand_runs + a.hand_runs_after + 1):
                hand.append(by_hand(target, i))
                note("by_hand", hand[-1])
        finally:
            stop.fn(target)
    hand_s = [float(h["nth_step_seconds"]) for h in hand]
    healthy = [float(k["healthy_seconds"]) for k in relaunched if k["healthy_seconds"] is not None]
    result = {
        "device": device,
        "environment": environment(device),
        "healthy_steps": target.thresholds.healthy_steps,
        "poll_interval_seconds": target.thresholds.poll_interval_seconds,
        "interval_seconds": a.interval_seconds,
        "by_hand": hand,
        "kills": relaunched,
        "by_hand_nth_step": summary(hand_s, unit="seconds", digits=2) if hand_s else None,
        # The hand starts after the kills read caches as warm as the relaunches did: the fairest pairing.
        "by_hand_after_kills_nth_step": summary(hand_s[hand_runs:], unit="seconds", digits=2) if hand_s[hand_runs:] else None,
        "kill_to_handover": summary([float(k["handed_over_seconds"]) for k in relaunched], unit="seconds", digits=2)
        if relaunched
        else None,
        "kill_to_healthy": summary(healthy, unit="seconds", digits=2) if healthy else None,
        "kill_to_recovery_returned": summary([float(k["recovery_returned_seconds"]) for k in relaunched], unit="seconds", digits=2)
        if relaunched
        else None,
        "target_seconds": round(statistics.median(hand_s) + SLACK_SECONDS, 2) if hand_s else None,
        "all_healthy": all(k["ok"] for k in relaunched),
        "load_average_before": before["load_average"],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.monotonic() - t0, 1),
    }
    result["meets_target"] = bool(healthy) and result["target_seconds"] is not None and max(healthy) <= result["target_seconds"]
    print(json.dumps(result))
    return 0 if result["all_healthy"] and len(relaunched) == kills else 1


if __name__ == "__main__":
    sys.exit(main())
