"""Wall time and peak memory of a callable (for benchmarks and reports, never for assertions in tests)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil


@dataclass(frozen=True)
class Measurement:
    wall_s: float
    peak_rss_delta_bytes: int  # peak resident memory during the call minus resident memory before it


def measure(fn: Callable[..., Any], *args: Any, interval_s: float = 0.002, **kwargs: Any) -> tuple[Any, Measurement]:
    """Run fn(*args, **kwargs); return (its result, Measurement). Memory is sampled by a background thread."""
    process = psutil.Process()
    baseline = process.memory_info().rss
    peak = baseline
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, process.memory_info().rss)
            time.sleep(interval_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    try:
        result = fn(*args, **kwargs)
    finally:
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
    peak = max(peak, process.memory_info().rss)
    return result, Measurement(wall_s=wall, peak_rss_delta_bytes=peak - baseline)
