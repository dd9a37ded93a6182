"""Make a file unreadable in a test, whoever runs it: chmod 000, and where that does not stop reads (root ignores
permission bits) the opens of that path raise PermissionError, as they would for another user."""

import builtins
import errno
import io
import os
from pathlib import Path


def make_unreadable(path: Path, monkeypatch) -> None:
    path.chmod(0)  # (nothing to undo: pytest removes tmp_path whole)
    if os.geteuid() != 0:
        return
    blocked = str(path)
    real_open = builtins.open

    def guarded(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.abspath(os.fspath(file)) == os.path.abspath(blocked):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    monkeypatch.setattr(io, "open", guarded)
