"""What every benchmark here shares for time: the best-of-repeats timer, the interleaved-rounds timer and the fitted
growth exponent.

Benchmarks are scripts (`python benchmarks/bench_X.py`), so this module is imported from the script's own folder.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def best_time(fn: Callable[..., Any], repeats: int, warmup: bool = True,
              setup: Callable[[], Any] | None = None) -> tuple[float, Any]:
    """(the fastest of `repeats` calls in seconds, the last call's result). The minimum is the least disturbed by
    other work on a shared machine; an optional untimed first call pays one-off costs (allocation, caches). With
    `setup`, each call is fn(setup()) and only fn is timed (a fresh state per repeat)."""
    def call() -> tuple[float, Any]:
        arg = () if setup is None else (setup(),)
        t0 = time.perf_counter()
        out = fn(*arg)
        return time.perf_counter() - t0, out

    if warmup:
        call()
    best, out = float("inf"), None
    for _ in range(repeats):
        sec, out = call()
        best = min(best, sec)
    return best, out


@dataclass(frozen=True)
class RoundTimes:
    """Seconds of every call of `interleaved_times`, by name: the untimed warm-up rounds' and the timed rounds'."""

    warmup: dict[str, list[float]]
    timed: dict[str, list[float]]

    def median(self, name: str) -> float:
        return statistics.median(self.timed[name])


def interleaved_times(fns: Mapping[str, Callable[[], Any]], rounds: int, warmup: int = 1,
                      before: Callable[[str], Any] | None = None) -> RoundTimes:
    """Call every fn once per round, round-robin (A, B, C, A, B, C, ...), so that load from other processes on a
    shared machine hits all of them alike; `warmup` rounds first (one-off costs: optimizer states, caches), kept
    apart. `before(name)`, if given, runs untimed before each call (e.g. to reset gradients)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(warmup + rounds):
        for name, fn in fns.items():
            if before is not None:
                before(name)
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return RoundTimes({n: t[:warmup] for n, t in times.items()}, {n: t[warmup:] for n, t in times.items()})


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The exponent p of ys ~ xs^p, by least squares on log-log axes."""
    return float(np.polyfit(np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float)), 1)[0])
