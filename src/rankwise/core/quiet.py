"""Silencing native code that prints to the process's standard output whatever its own options say.

`silence_native_stdout()` points file descriptor 1 at the null device for the duration of a block: C and C++
libraries write there directly (printf, std::cout), below Python's `sys.stdout`, so `contextlib.redirect_stdout`
cannot catch them. The C library's stdout buffer is flushed before the descriptor is restored, so nothing written
inside the block surfaces later (when stdout is a pipe or a file, printf output waits in that buffer).

Use it around one native call that is known to print (e.g. HiGHS 1.12's MIP solver, `algorithms.config_search`),
not around Python code: while the block runs, whatever any thread of the process writes to stdout is discarded.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def _flush_c_stdio() -> None:
    """fflush(NULL): write out every C stdio buffer of the process (where the C library can be reached)."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # no C library handle on this platform: nothing we can flush
        pass


@contextmanager
def silence_native_stdout() -> Iterator[None]:
    """Discard what is written to file descriptor 1 inside the block; descriptor 1 is restored afterwards."""
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 (a detached process): nothing can be printed anyway
        yield
        return
    if sys.stdout is not None:
        sys.stdout.flush()  # what Python printed before the block still goes out
    _flush_c_stdio()
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(devnull)
        os.close(saved)
