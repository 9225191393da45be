"""Write docs/fault-matrix.md from the fault registry in tests/test_fault_matrix.py (`--check`: only compare)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tests.test_fault_matrix  # noqa: E402,F401 - importing the tests fills the registry
from tests.faults import DOC, REGISTRY, render_matrix  # noqa: E402


def main() -> int:
    text = render_matrix(REGISTRY)
    if "--check" in sys.argv[1:]:
        same = DOC.exists() and DOC.read_text() == text
        print(f"{DOC.relative_to(ROOT)} is {'up to date' if same else 'stale: run python bench/render_fault_matrix.py'}")
        return 0 if same else 1
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
    print(
        f"wrote {DOC.relative_to(ROOT)} ({sum(1 for line in text.splitlines() if line.startswith('| ') and not line.startswith('| guarantee'))} rows)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
