"""`relaunch demo`: the demo target built, broken as a scenario says, and recovered (docs/demo.md)."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Any

import typer

from relaunch.cli.root import app, errors, exit_for, print_report, run_flow, stop_target


class Scenario(str, Enum):
    """The demo's scenarios (relaunch.demo.scenarios.SCENARIOS; tests/test_cli_options.py keeps them the same)."""

    HEALTHY = "healthy"
    MISSING_DEPENDENCY = "missing-dependency"
    FX_RACE = "fx-race"
    SILENT_DEATH = "silent-death"
    DEGRADED = "degraded"
    DIVERGED = "diverged"
    BROKEN_CHECKPOINT = "broken-checkpoint"
    CORRUPT_CACHE = "corrupt-cache"
    MULTI_NODE = "multi-node"


class Device(str, Enum):
    CUDA = "cuda"
    CPU = "cpu"


@app.command()
def demo(
    scenario: Scenario = typer.Option(
        Scenario.FX_RACE,
        help="The fault to break the demo trainer with. Default: the incident's own, a drifted venv whose "
        "FX tracing races the compiled drafters; `healthy` breaks nothing a run would die of.",
    ),
    workdir: Path = typer.Option(Path(".cache/demo"), help="Folder for the demo targets."),
    name: str | None = typer.Option(
        None,
        help="The demo target's name, also its tmux session (default relaunch-demo-SCENARIO): two demos at once, or beside your own runs.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    keep_running: bool = typer.Option(False, help="Leave the recovered trainer running in tmux."),
    device: Device | None = typer.Option(
        None,
        help="cuda: the trainer on the GPUs, compiled flex_attention, torch from this interpreter; cpu. Default: cuda where torch sees a GPU.",
    ),
) -> None:
    """Build the demo target, break it as the scenario says, recover it with Prefect's embedded default."""
    from relaunch.demo.scenarios import SCENARIOS, prepare
    from relaunch.demo.target import resolve_device

    scenario = Scenario(scenario).value
    if scenario not in SCENARIOS:
        print(f"relaunch: unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}", file=sys.stderr)
        raise typer.Exit(2)
    from relaunch.flows.recover import recover_training

    if SCENARIOS[scenario].nodes > 1:
        from relaunch.demo.multinode import broken_gang

        # Its hosts are namespaces that go with it: the gang is stopped and they are removed on exit (and on Ctrl-C).
        with errors(as_json), broken_gang(workdir.resolve() / scenario) as target:
            report = run_flow(recover_training, as_json, target=target)
        print_report(report, as_json)
        exit_for(report)
        return
    with errors(as_json):
        target = prepare(scenario, workdir.resolve() / scenario, name=name, device=resolve_device(device.value if device else None))
        target_file = _write_target(target, workdir.resolve() / scenario / "target.yaml")
        try:
            report = run_flow(recover_training, as_json, target=target)
        finally:
            if not keep_running:
                # Recorded as a person's stop: the `relaunch check` the demo suggests next says `stopped`, not crashed.
                stop_target(target, deliberate=True)
    print_report(report, as_json)
    if not as_json:
        print(f"logs: {target.log_dir}   patches and run records: {target.state_path}")
        print(
            "the recovered trainer was stopped at the end; --keep-running leaves it in tmux"
            if not keep_running
            else f"the trainer runs on: tmux attach -t {target.tmux_session}"
        )
        exe = Path(sys.argv[0]).resolve() if Path(sys.argv[0]).name == "relaunch" else "relaunch"
        print(
            f"the demo's target file: {target_file}; try:\n  {exe} check {target_file}\n  {exe} logs {target_file}\n  {exe} stop {target_file}"
        )
    exit_for(report)


def _write_target(target: Any, path: Path) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(target.model_dump(mode="json", exclude_defaults=True), sort_keys=False))
    return path
