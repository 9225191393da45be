"""The GPU demo's plumbing on this CPU machine: `--device`, and a venv that takes torch from its interpreter.

The GPU runs themselves are in tests/fixtures/logs/gpu/ (PROVENANCE.md, "The demo on the GPU").
uv never downloads here: every venv is built offline (`--no-index`, UV_OFFLINE) from local wheels, and no
lock below pins torch, which comes from the interpreter running the tests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relaunch.config import Target
from relaunch.demo.scenarios import prepare
from relaunch.demo.target import GPU_THRESHOLDS
from relaunch.plans.rebuild_venv import parse_pins, plan_rebuild
from relaunch.steps import RebuildDetail
from relaunch.tasks.rebuild_venv import rebuild_venv
from relaunch.tasks.stop import stop
from relaunch.testing.targets import shell_target
from tests.test_cli import typed

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # Belt and braces beside the targets' own --no-index: a torch pulled from an index would be a 3 GB CUDA build.
    monkeypatch.setenv("UV_OFFLINE", "1")


def venv_python(target: Target, code: str) -> str:
    return subprocess.run([f"{target.venv_dir}/bin/python", "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_a_venv_with_system_site_packages_imports_the_interpreters_torch_and_the_rebuild_records_its_version(tmp_path: Path) -> None:
    # This interpreter is itself a venv (the project's), as the H200 image's python3 is (/opt/torch/.venv): torch is
    # in its own site-packages, not in its base interpreter's.
    assert sys.prefix != sys.base_prefix
    target = shell_target(tmp_path, python=sys.executable, system_site_packages=True, import_check=["torch", "tinyjunk"])
    assert "--no-index" in plan_rebuild(target, "stamp")["install"].argv and "torch" not in parse_pins(Path(target.lock_path).read_text())

    record = rebuild_venv.fn(target)

    detail = record.detail
    assert isinstance(detail, RebuildDetail)
    assert detail.system_site_packages and detail.from_image == {"torch": torch.__version__}
    assert detail.drift == [] and detail.shadowed == [], "the lock's own packages are exactly the lock"
    assert f"from the image: torch {torch.__version__}" in detail.notes()
    seen = venv_python(target, "import torch, tinyjunk; print(torch.__version__, torch.__file__, tinyjunk.__file__)").split()
    assert seen[0] == torch.__version__ and seen[1] == torch.__file__, "the venv runs the outer interpreter's torch"
    assert seen[2].startswith(f"{target.venv_dir}/"), "the lock's packages live in the venv itself"
    freeze = subprocess.run(
        ["uv", "pip", "freeze", "--python", f"{target.venv_dir}/bin/python"], capture_output=True, text=True, check=True
    )
    assert parse_pins(freeze.stdout) == {"tinyjunk": "0.1.0"}, "the image's packages are seen, never installed into the venv"


def test_a_venv_without_system_site_packages_does_not_see_the_interpreters_torch(tmp_path: Path) -> None:
    target = shell_target(tmp_path, python=sys.executable, import_check=["tinyjunk"])

    record = rebuild_venv.fn(target)

    assert not record.detail.system_site_packages and record.detail.from_image == {}
    missing = subprocess.run([f"{target.venv_dir}/bin/python", "-c", "import torch"], capture_output=True, text=True)
    assert missing.returncode == 1 and "ModuleNotFoundError: No module named 'torch'" in missing.stderr


def test_the_cuda_demo_target_trains_on_the_gpu_with_torch_from_the_image_and_thresholds_for_the_gpu(tmp_path: Path) -> None:
    # `healthy` breaks nothing by launching, so the cuda target can be built whole on a machine without a GPU.
    target = prepare("healthy", tmp_path / "healthy", name="gpu-plumbing", device="cuda")
    try:
        lock = parse_pins(Path(target.lock_path).read_text())
        assert lock == {"tinyattn": "1.0.0", "tinyaccel": "1.0.0"}, "the lock leaves torch to the image"
        assert target.system_site_packages and target.python == sys.executable
        assert "--device cuda" in target.launch_command and target.warmup_command == "python warmup.py --devices cuda:0"
        assert target.thresholds.baseline_tokens_per_second == GPU_THRESHOLDS.baseline_tokens_per_second
        assert target.thresholds.expected_gpus == 1 and target.env["PYTHONPATH"] == ""
        # The user's hand-made venv, built as relaunch builds one: the interpreter's torch, the lock, the pollution.
        seen = venv_python(target, "import torch, tinyattn, tinyjunk; print(torch.__version__)")
        assert seen == torch.__version__
    finally:
        stop.fn(target)


def test_the_cpu_demo_target_keeps_torch_in_its_own_lock_and_venv(tmp_path: Path) -> None:
    target = prepare("healthy", tmp_path / "healthy", name="cpu-plumbing", device="cpu")
    try:
        assert not target.system_site_packages and "--device" not in target.launch_command
        assert parse_pins(Path(target.lock_path).read_text())["torch"] == torch.__version__
        assert venv_python(target, "import torch; print(torch.__file__)").startswith(f"{target.venv_dir}/")
    finally:
        stop.fn(target)


def test_demo_device_cuda_is_refused_with_exit_2_where_torch_sees_no_gpu(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()

    done = typed(["demo", "--device", "cuda", "--workdir", str(tmp_path / "demo")], home)

    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip().splitlines()[-1]
        == f"relaunch: --device cuda: torch {torch.__version__} in {sys.executable} sees no GPU; use --device cpu"
    )
    assert not (tmp_path / "demo").exists(), "refused before anything was built"


GPU_DEMO = Path(__file__).parent / "fixtures" / "logs" / "gpu" / "demo"


@pytest.mark.parametrize(
    ("log", "args", "verdict"),
    [
        # The race's GPU face: the drafters' compiled flex_attention meets the thread FX-tracing for tinyattn 1.1.
        (
            "fx-race/relaunch-demo-fx-race-20261129T213022.829284Z-a0.log",
            ["--exit-code", "1"],
            "verdict: crashed (fx_tracing_race): fx_tracing_race: NameError: module is not installed as a submodule",
        ),
        (
            "degraded/relaunch-demo-degraded-20261129T213320.344291Z-a0.log",
            ["--running", "--seconds-since-log-write", "1", "--baseline-tokens-per-second", "600000"],
            "verdict: degraded: 10600 tok/s, 2% of baseline",
        ),
        # Uncompiled flex_attention from two drafter threads (torch 2.11) dies at its first call: why the demo's hack
        # falls back to tinyattn's reference path on the GPU too.
        (
            "degraded_uncompiled_flex.log",
            ["--exit-code", "1"],
            "verdict: crashed (error): error: AssertionError: expected preserved node meta",
        ),
        (
            "diverged/relaunch-demo-diverged-20261129T213922.037012Z-a0.log",
            ["--running", "--seconds-since-log-write", "1", "--baseline-tokens-per-second", "600000"],
            "verdict: diverged: loss not finite since step 27",
        ),
    ],
)
def test_the_h200_demo_runs_broken_logs_are_diagnosed_as_the_flow_diagnosed_them(
    log: str, args: list[str], verdict: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()

    done = typed(["diagnose", str(GPU_DEMO / log), *args], home)

    assert done.stdout.splitlines()[0] == verdict, done.stdout + done.stderr
    assert done.returncode == 1
