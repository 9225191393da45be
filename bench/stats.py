"""The one way every benchmark here summarises its samples, and the machine it ran on.

p95 is the nearest-rank percentile: sort the n values and take the one at rank ceil(0.95 * n) (1-based).
No interpolation, so it is always a value that was measured. For n < 20 that rank is n: the p95 is the
maximum, and a benchmark that wants a p95 distinct from its maximum needs at least 20 samples.
The median is the usual one (the mean of the two middle values for an even n).

    from bench.stats import P95_METHOD, machine, summary
    summary([0.1, 0.2, 0.3], unit="seconds")  # {"n": 3, "min_seconds": 0.1, "median_seconds": 0.2, ...}
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

P95_METHOD = "nearest-rank: value at ceil(0.95*n) of n sorted"


def nearest_rank(values: Iterable[float], percent: int) -> float:
    """The value at rank ceil(percent/100 * n) of the sorted values (integer arithmetic: no float rounding)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    if not 0 < percent <= 100:
        raise ValueError(f"percent must be in (0, 100], not {percent}")
    rank = -(-percent * len(ordered) // 100)  # ceil without floats: 95 * 20 // 100 is exactly 19
    return ordered[rank - 1]


def p95(values: Iterable[float]) -> float:
    return nearest_rank(values, 95)


def summary(values: Iterable[float], *, unit: str = "", digits: int = 3) -> dict[str, float | int]:
    """n, min, median, p95 (nearest rank) and max; keys get `_UNIT` appended when a unit is given."""
    ordered = sorted(values)
    suffix = f"_{unit}" if unit else ""
    return {
        "n": len(ordered),
        f"min{suffix}": round(ordered[0], digits),
        f"median{suffix}": round(statistics.median(ordered), digits),
        f"p95{suffix}": round(p95(ordered), digits),
        f"max{suffix}": round(ordered[-1], digits),
    }


def machine() -> dict[str, object]:
    """What the numbers were measured on: CPUs this process may use (as `nproc` counts), CPU model, load, date."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": _memory_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in load],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None
