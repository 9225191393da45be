"""relaunch's wheel, built from this checkout and installed into a fresh venv with no torch: once per state of the
sources, shared by every test (and every xdist worker) that needs an installed relaunch."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What the wheel is built from (pyproject.toml's packages and package-dir, the readme and licence it names).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "relaunch", "flows", "tasks", "demo", "docs")
IGNORED = shutil.ignore_patterns(".git", ".venv", ".cache", "build", "*.egg-info", "__pycache__")


def run(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)


def sources_digest() -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        path = ROOT / name
        for f in sorted([path] if path.is_file() else (p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)):
            digest.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def installed_venv(shared: Path) -> Path:
    """The venv (under SHARED, a folder every test process of the session sees) with the wheel installed."""
    base = shared / f"relaunch-wheel-{sources_digest()}"
    base.mkdir(parents=True, exist_ok=True)
    venv = base / "venv"
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others wait for its venv
        if (base / ".installed").exists():
            return venv
        # Built from a copy: setuptools writes build/ and *.egg-info beside the sources it builds.
        source = base / "source"
        shutil.rmtree(source, ignore_errors=True)
        source.mkdir()
        for name in SOURCES:
            (shutil.copy2 if (ROOT / name).is_file() else lambda a, b: shutil.copytree(a, b, ignore=IGNORED))(ROOT / name, source / name)
        built = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(base / "dist"), str(source)])
        assert built.returncode == 0, built.stderr[-2000:]
        (wheel,) = (base / "dist").glob("relaunch-*.whl")
        uv = Path(sys.executable).parent / "uv"
        python = getattr(sys, "_base_executable", sys.executable)
        shutil.rmtree(venv, ignore_errors=True)
        assert run([str(uv), "venv", "-q", "--python", python, str(venv)]).returncode == 0
        installed = run([str(uv), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(wheel)])
        assert installed.returncode == 0, installed.stderr[-2000:]
        (base / ".installed").touch()
    return venv


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """A bare environment, as on a bastion with only the wheel: no project venv on PATH, its own HOME and PREFECT_HOME."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_HOME": str(home / "prefect-home"),
        **extra,
    }
