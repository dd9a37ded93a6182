"""The names of the temporaries that the atomic writers (`core.io.atomic_path`, `atomic_dir`) create beside their
destination: `.NAME.rwPID@HOST.` + 8 random characters + `.tmp` (or `.old`).

Torch-free, so that the CLI's output checks (`commands.common.check_output`) can tell up front, from the same
formula, whether such a name still fits the file system's limit on a name: an `--out` name that fits but whose
temporary does not would otherwise fail only when the result is written, after all the work.
"""

from __future__ import annotations

import os
import re
import socket

HOST = re.sub(r"[^A-Za-z0-9-]", "", socket.gethostname())[:32] or "host"
RANDOM_TAIL = 8 + len(".tmp")  # tempfile's 8 random characters, then the suffix (".tmp", or ".old" of the same length)


def temp_prefix(name: str) -> str:
    """`.NAME.rwPID@HOST.`: temporaries name their writer, so a later write can tell which ones a killed run left."""
    return f".{name}.rw{os.getpid()}@{HOST}."


def temporary_name_bytes(name: str) -> int:
    """The length in bytes of the longest temporary an atomic write of `name` creates beside it."""
    return len(os.fsencode(temp_prefix(name))) + RANDOM_TAIL
