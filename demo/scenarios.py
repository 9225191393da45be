"""Each scenario breaks the demo target the way the incident did, then lets the broken run fail for real."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from relaunch import runlayout
from relaunch.config import Target
from relaunch.deciding.checkpoints import Choice, step_of
from relaunch.demo.target import GOOD_PINS, Device, base_pins, build_repo, make_target, wheelhouse
from relaunch.demo.wheels import build_all
from relaunch.plans.rebuild_venv import plan_create
from relaunch.plans.stop import plan_stop
from relaunch.plans.warm_cache import plan_warm
from relaunch.tasks.health import collect_snapshot
from relaunch.tasks.launch import launch
from relaunch.vocabulary import Cause, Verdict
from relaunch.wire.transport import local_env, run, transport_for

SLOW_HACK = ("USE_COMPILE = True", "USE_COMPILE = False  # HACK: FX check patched away, runs uncompiled")
DEBUG_HACK = ("def loss_and_accuracy(", "# HACK: debugging print left in\ndef loss_and_accuracy(")


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    expected_cause: Cause | None  # the cause the first attempt must name
    expected_verdict: Verdict
    nodes: int = 1  # more: a gang on hosts of their own (relaunch.demo.multinode), not prepared here


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("healthy", "never launched; polluted venv, hacked model file, stale cache", None, Verdict.UNKNOWN),
        Scenario("missing-dependency", "the lock misses tinyaccel, which the trainer imports", Cause.MISSING_DEPENDENCY, Verdict.CRASHED),
        Scenario("fx-race", "the venv drifted to tinyattn 1.1, which FX-traces in a thread", Cause.FX_TRACING_RACE, Verdict.CRASHED),
        Scenario("silent-death", "the trainer and its tmux session killed after a checkpoint", Cause.SILENT_EXIT, Verdict.CRASHED),
        Scenario("degraded", "the model file hacked to skip torch.compile: about 100x slower", None, Verdict.DEGRADED),
        Scenario("diverged", "launched by hand with a learning-rate spike at step 25: the loss goes nan", None, Verdict.DIVERGED),
        Scenario(
            "broken-checkpoint",
            "the newest checkpoint truncated (a save cut short), and the run resumed from it",
            Cause.BROKEN_CHECKPOINT,
            Verdict.CRASHED,
        ),
        Scenario(
            "corrupt-cache",
            "a good compile cache damaged (its generated modules cut short; on a GPU, Triton's kernel images overwritten): the trainer dies at start-up",
            Cause.CORRUPT_CACHE,
            Verdict.CRASHED,
        ),
        Scenario(
            "multi-node",
            "a two-node torchrun gang on two hosts in network namespaces (root), the rank on the second node SIGKILLed",
            Cause.KILLED,
            Verdict.CRASHED,
            nodes=2,
        ),
    ]
}


def say(message: str) -> None:
    # stderr: stdout is for the report (`--json` must stay parseable).
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def prepare(scenario: str, work: Path, name: str | None = None, device: Device = "cpu") -> Target:
    """A fresh target in work/, broken as the scenario says, its broken run already dead or crawling.

    `name` (also its tmux session) defaults to relaunch-demo-SCENARIO; give another where two may run at once.
    On `cuda` the trainer runs on the GPUs and its venv takes torch from the interpreter running this
    (the image's), so the lock holds only the demo's own packages and no wheelhouse is needed.
    """
    name = name or f"relaunch-demo-{scenario}"
    target = build_target(work, name, device, without=("tinyaccel",) if scenario == "missing-dependency" else ())
    extra = ["tinyjunk==0.1.0"] + (["tinyattn==1.1.0"] if scenario == "fx-race" else [])
    say(f"polluting the venv: {', '.join(extra)}")
    _user_venv(target, extra)
    hack = SLOW_HACK if scenario == "degraded" else DEBUG_HACK
    say(f"hacking model.py: {hack[1].splitlines()[0]}")
    model = Path(target.repo_dir) / "model.py"
    model.write_text(model.read_text().replace(*hack, 1))
    # Laid out as inductor lays out its cache (code in two-character hash folders), from another build.
    stale = Path(target.inductor_cache_dir) / "zz"
    stale.mkdir(parents=True)
    (stale / "czzstale.so").write_bytes(b"stale kernel from another torch build\n")
    try:
        BREAKERS.get(scenario, lambda t: None)(target)
    except BaseException:
        # A breaking that failed or was interrupted leaves no trainer of its own behind (it would hold the session).
        run(transport_for(target.host), plan_stop(target, 20), check=False)  # the failure that matters is raised
        raise
    return target


def build_target(work: Path, name: str, device: Device = "cpu", without: tuple[str, ...] = ()) -> Target:
    """The known-good demo target in a fresh work/ (an earlier trainer there stopped first): repo, lock, wheels; no venv yet.

    `without`: packages the lock leaves out.
    """
    if work.exists():
        _stop_previous(work, name)
        shutil.rmtree(work)
    work.mkdir(parents=True)
    wheels = work / "wheels"
    build_all(wheels)
    base = wheelhouse() if device == "cpu" else None
    pins = {n: v for n, v in {**(base_pins(base) if base else {}), **GOOD_PINS}.items() if n not in without}
    say(f"building the target in {work} for {device}")
    build_repo(work / "repo", pins)
    return make_target(work, name, wheels, base) if device == "cpu" else make_target(work, name, wheels, None, device)


def _user_venv(target: Target, extra: list[str]) -> None:
    flags = ["--no-index", *sum((["--find-links", f] for f in target.find_links), [])]
    env = local_env()  # relaunch's own uv, also from a shell whose PATH lacks it
    # Created as relaunch creates one (the image's packages seen where the target says so), without its marker.
    run(transport_for(target.host), plan_create(target, marker=None))
    for spec in (["-r", target.lock_path], extra):  # the lock, then what was added by hand later
        subprocess.run(["uv", "pip", "install", "-q", "--python", f"{target.venv_dir}/bin/python", *flags, *spec], check=True, env=env)


def _launch_broken(target: Target, choice: Choice | None = None) -> None:
    say("launching the broken run")
    launch.fn(target, 0, choice=choice)


def _wait_until(target: Target, what: str, done: Callable[[object], bool], timeout_seconds: float = 240) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        snap = collect_snapshot(target, wait_seconds=1)
        if done(snap):
            return
    raise SystemExit(f"demo: the broken run never reached '{what}' within {timeout_seconds:.0f} s")


def _crash(target: Target, choice: Choice | None = None) -> None:
    _launch_broken(target, choice)
    _wait_until(target, "exit", lambda s: s.exit_code is not None)
    say("the broken run died")


def _silent_death(target: Target) -> None:
    _launch_broken(target)
    ckpt = Path(target.checkpoint_dir or "")
    _wait_until(target, "first checkpoint", lambda s: any(ckpt.glob("step_*.pt")))
    run_id = Path(runlayout.current_file(target.state_path)).read_text().strip()
    supervisor = int(Path(runlayout.record(target.state_path, run_id, runlayout.SUPERVISOR_PID)).read_text().split()[0])
    # What the incident saw: process and tmux session gone at once, nothing written after.
    os.killpg(supervisor, signal.SIGKILL)
    subprocess.run(["tmux", "kill-session", "-t", f"={target.tmux_session}"], check=False)
    say(f"killed the trainer's process group {supervisor} and its tmux session")


def _slow(target: Target) -> None:
    _launch_broken(target)


def _diverge(target: Target) -> None:
    # The run as someone launched it by hand, with a bad schedule; relaunch later uses the target's own command.
    spiked = target.model_copy(update={"launch_command": f"{target.launch_command} --lr-jump-at 25"})
    _launch_broken(spiked)
    # On a GPU the first non-finite loss may print as inf before the nan.
    _wait_until(target, "a nan loss", lambda s: any(f"loss={bad}" in line for line in s.log_tail[-3:] for bad in ("nan", "inf")))
    say("the loss went nan after the learning-rate spike at step 25")


def _truncate_newest_checkpoint(target: Target) -> None:
    _launch_broken(target)
    ckpt = Path(target.checkpoint_dir or "")
    _wait_until(target, "two checkpoints", lambda s: len(list(ckpt.glob("step_*.pt"))) >= 2)
    run(transport_for(target.host), plan_stop(target, 20))
    newest = max(ckpt.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    # What a save cut short leaves: the first part of the archive, without its central directory.
    os.truncate(newest, newest.stat().st_size // 2)
    # Resumed from by hand, as the incident's run was: relaunch's own launch judges the save cut and never takes it.
    say(f"truncated {newest.name} to half its size; resuming from it")
    _crash(target, Choice(name=newest.name, step=step_of(newest.name), why="the newest save, taken by hand"))


def _damage_warm_cache(target: Target) -> None:
    # A good cache first, warmed as relaunch warms one (the trainer's environment, single-threaded).
    say("warming a good compile cache")
    run(transport_for(target.host), plan_warm(target, "demo")["warm"])
    cache = Path(target.inductor_cache_dir)
    if "--device cuda" in target.launch_command:
        # Triton's kernel images overwritten in place (what a bad disk or a foreign write leaves): the driver refuses them
        # on every start (gpu/cache_cubin_garbage.log, _rerun.log). Cut short instead they die of SIGSEGV saying nothing.
        damaged = [p for p in (cache / "triton").rglob("*.cubin") if p.is_file()]
        for path in damaged:
            path.write_bytes(os.urandom(path.stat().st_size))
    else:
        # On the CPU torch recompiles past damaged graph entries and kernels (cpu/compile_cache_entries_truncated.log),
        # but imports its generated modules as it finds them (cpu/compile_cache_module_truncated.log).
        damaged = [p for p in cache.glob("??/c*.py") if p.is_file()]
        for path in damaged:
            os.truncate(path, path.stat().st_size // 2)
    if not damaged:
        raise SystemExit(f"demo: the warm-up left nothing to damage in {cache}")
    say(f"damaged {len(damaged)} cached file(s) in {cache}")
    _crash(target)


BREAKERS: dict[str, Callable[[Target], None]] = {
    "corrupt-cache": _damage_warm_cache,
    "diverged": _diverge,
    "broken-checkpoint": _truncate_newest_checkpoint,
    "missing-dependency": _crash,
    "fx-race": _crash,
    "silent-death": _silent_death,
    "degraded": _slow,
}


def _stop_previous(work: Path, name: str) -> None:
    """A demo folder from an earlier run may still have a trainer: stop it by its records first."""
    state = work / "state"
    if state.exists() or subprocess.run(["tmux", "has-session", "-t", f"={name}"], capture_output=True).returncode == 0:
        target = Target(
            name=name,
            repo_dir=str(work / "repo"),
            venv_dir=str(work / "venv"),
            lock_file="x",
            launch_command="true",
            log_dir=str(work / "logs"),
            state_dir=str(state),
            tmux_session=name,
        )
        run(transport_for(target.host), plan_stop(target, 20), check=False)
