"""The one way to pin torch's intra-op threads for a stretch of work, restoring the previous count afterwards.

Small dense work (eigh / SVD of a few hundred rows, block quantization, small-matmul experiments) gains little from
threads, and on a busy machine multithreaded kernels spin-wait: eigh of a 576 x 576 float64 matrix took 0.05 s of
CPU on one thread against 0.2-8 s on two while other processes shared the cores.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from rankwise.errors import InvalidInputError


@contextmanager
def limit_threads(n: int | None, at_most: bool = False) -> Iterator[None]:
    """Run the enclosed torch work on `n` intra-op threads (None: leave torch's setting); with `at_most`, never on
    more than the current count (a caller that chose one thread keeps one)."""
    before = torch.get_num_threads()
    if n is not None and n < 1:
        raise InvalidInputError(f"threads must be at least 1, got {n}")
    wanted = before if n is None else (min(n, before) if at_most else n)
    if wanted != before:
        torch.set_num_threads(wanted)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
