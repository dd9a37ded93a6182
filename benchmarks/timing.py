"""What every benchmark here shares: the best-of-repeats timer and the fitted growth exponent.

Benchmarks are scripts (`python benchmarks/bench_X.py`), so this module is imported from the script's own folder.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def best_time(fn: Callable[[], Any], repeats: int, warmup: bool = True) -> tuple[float, Any]:
    """(the fastest of `repeats` calls in seconds, the last call's result). The minimum is the least disturbed by
    other work on a shared machine; an optional untimed first call pays one-off costs (allocation, caches)."""
    if warmup:
        fn()
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The exponent p of ys ~ xs^p, by least squares on log-log axes."""
    return float(np.polyfit(np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float)), 1)[0])
