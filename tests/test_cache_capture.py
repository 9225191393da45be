"""bench/gpu_capture/damage_cache.py damages exactly what a face's name says (tests/fixtures/logs/gpu/PROVENANCE.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DAMAGE = Path(__file__).resolve().parent.parent / "bench" / "gpu_capture" / "damage_cache.py"


def damage(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DAMAGE), args[0], str(root), *args[1:]], capture_output=True, text=True, timeout=30)


def a_cache(root: Path) -> dict[str, bytes]:
    """A small cache shaped like the warmed one: Triton's driver module under HOME, kernels and fx-graph entries under inductor."""
    files = {
        "home/.triton/cache/H/cuda_utils.cpython-312-x86_64-linux-gnu.so": bytes(range(256)) * 4,
        "inductor/triton/0/K/triton_poi_fused_0.cubin": b"\x7fELF" + b"k" * 996,
        "inductor/triton/0/K/triton_poi_fused_0.json": b'{"name": "triton_poi_fused_0"}',
        "inductor/fxgraph/57/f573/hvz": b"p" * 600,
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def test_half_cuts_only_the_selected_files_to_half_and_names_each(tmp_path: Path) -> None:
    files = a_cache(tmp_path)
    run = damage(tmp_path, "half", ".so", "inductor/fxgraph/")
    assert run.returncode == 0, run.stdout + run.stderr
    sizes = {rel: (tmp_path / rel).stat().st_size for rel in files}
    assert sizes["home/.triton/cache/H/cuda_utils.cpython-312-x86_64-linux-gnu.so"] == 512
    assert sizes["inductor/fxgraph/57/f573/hvz"] == 300
    assert (tmp_path / "inductor/triton/0/K/triton_poi_fused_0.cubin").read_bytes() == files["inductor/triton/0/K/triton_poi_fused_0.cubin"]
    assert "half home/.triton/cache/H/cuda_utils.cpython-312-x86_64-linux-gnu.so 1024 -> 512" in run.stdout
    assert "half: 2 files damaged" in run.stdout


def test_garbage_keeps_each_size_and_changes_the_bytes(tmp_path: Path) -> None:
    files = a_cache(tmp_path)
    assert damage(tmp_path, "garbage", ".cubin").returncode == 0
    cubin = tmp_path / "inductor/triton/0/K/triton_poi_fused_0.cubin"
    assert cubin.stat().st_size == 1000
    assert cubin.read_bytes() != files["inductor/triton/0/K/triton_poi_fused_0.cubin"]


def test_a_random_prefix_of_every_file_is_the_same_cut_each_time(tmp_path: Path) -> None:
    # The seed makes the "cut off mid-write" face reproducible: cache_prefix_all.damage can be made again.
    records = []
    for copy in ("a", "b"):
        files = a_cache(tmp_path / copy)
        run = damage(tmp_path / copy, "prefix")
        assert run.returncode == 0
        assert all((tmp_path / copy / rel).stat().st_size < len(data) for rel, data in files.items())
        records.append(run.stdout.replace(str(tmp_path / copy), "ROOT"))
    assert records[0] == records[1]


def test_a_damage_that_matches_no_file_fails_so_no_undamaged_run_is_captured_under_its_name(tmp_path: Path) -> None:
    a_cache(tmp_path)
    run = damage(tmp_path, "half", ".hsaco")
    assert run.returncode == 1
    assert "half: 0 files damaged" in run.stdout
