"""Build the demo's pure-Python wheels from demo/packages/NAME-VERSION/ with no build backend."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

PACKAGES = Path(__file__).parent / "packages"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(
    dest: Path,
    name: str,
    version: str,
    files: dict[str, bytes],
    compression: int = zipfile.ZIP_DEFLATED,
    requires: tuple[str, ...] = (),
) -> Path:
    """A valid pure-Python wheel holding files (path inside the wheel -> bytes); `requires`: its Requires-Dist lines."""
    dist_info = f"{name}-{version}.dist-info"
    files = dict(files)
    needs = "".join(f"Requires-Dist: {r}\n" for r in requires)
    files[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{needs}".encode()
    files[f"{dist_info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: relaunch-demo\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items()) + f"{dist_info}/RECORD,,\n"
    files[f"{dist_info}/RECORD"] = record.encode()
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression) as zf:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return wheel


def _sources(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.suffix == ".py"}


def build_wheel(source: Path, dest: Path) -> Path:
    """source is NAME-VERSION/ holding the import package; returns the wheel path.

    A BASE file names another release whose files this one starts from (a release adds to the last).
    """
    name, version = source.name.rsplit("-", 1)
    base = source / "BASE"
    files = _sources(PACKAGES / base.read_text().strip()) if base.exists() else {}
    files.update(_sources(source))
    return write_wheel(dest, name, version, files)


def build_all(dest: Path) -> list[Path]:
    return [build_wheel(src, dest) for src in sorted(PACKAGES.iterdir()) if src.is_dir()]
