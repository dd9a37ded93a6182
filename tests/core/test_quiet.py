"""`core.quiet.silence_native_stdout`: what native code writes to descriptor 1 inside the block is discarded, C's
buffered printf output included, and stdout works as before afterwards."""

import ctypes
import os

from rankwise.core.quiet import silence_native_stdout


def test_native_writes_inside_the_block_are_discarded_and_stdout_is_restored(capfd):
    libc = ctypes.CDLL(None)
    print("before")
    with silence_native_stdout():
        os.write(1, b"raw write\n")
        libc.printf(b"buffered printf\n")  # sits in C's stdout buffer (fd 1 is not a terminal) until flushed
    libc.fflush(None)
    print("after")
    assert capfd.readouterr().out == "before\nafter\n"


def test_an_exception_inside_the_block_still_restores_stdout(capfd):
    try:
        with silence_native_stdout():
            raise ValueError("boom")
    except ValueError:
        pass
    os.write(1, b"visible\n")
    assert capfd.readouterr().out == "visible\n"
