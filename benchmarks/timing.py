"""Side-by-side timing shared by the speed benchmarks: alternating rounds, so machine noise hits both sides."""

from __future__ import annotations

import time
from collections.abc import Callable


def time_side_by_side(a: Callable[[], object], b: Callable[[], object], rounds: int, steps: int,
                      warmup: int = 20) -> tuple[list[float], list[float]]:
    """Microseconds per call of ``a`` and ``b``, alternating in ``rounds`` blocks of ``steps`` calls each."""
    for _ in range(warmup):
        a()
        b()
    ta, tb = [], []
    for _ in range(rounds):
        for fn, out in ((a, ta), (b, tb)):
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            out.append((time.perf_counter() - start) / steps * 1e6)
    return ta, tb
