"""One writer per output folder: two commands given the same `--out` would both print "wrote" and the last would win.

`output_lock(DIR)` holds a lock file beside DIR (`.DIR.rankwise-lock` in its parent: DIR itself may not exist yet, and
the atomic writers replace it whole) for as long as the command runs. A second command refuses, naming the first's
process and command line. A lock whose process is gone (killed, the machine rebooted) is stale and is taken over, so
a SIGKILL never blocks the folder for good. The lock is created with O_EXCL, so two commands that start at the same
instant cannot both take it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rankwise.errors import InvalidInputError

SUFFIX = ".rankwise-lock"
NAME_MAX = 255  # the common file-name limit (ext4, xfs, btrfs, tmpfs)


def lock_path(out: str | os.PathLike) -> Path:
    path = Path(out).absolute()
    name = f".{path.name}{SUFFIX}"
    if len(name.encode()) > NAME_MAX:  # a long --out name: a digest of it, the same for every command that asks
        name = f".{hashlib.sha256(path.name.encode()).hexdigest()[:32]}{SUFFIX}"
    return path.parent / name


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _holder(lock: Path) -> dict | None:
    """The live holder recorded in `lock`, or None when the lock is stale (its process gone) or unreadable."""
    try:
        record = json.loads(lock.read_text(encoding="utf-8"))
        pid, host = int(record["pid"]), str(record["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # half-written by a writer killed mid-write, or not ours: nothing holds it
    if host != socket.gethostname():
        return record  # another machine's process on a shared disk: we cannot tell, so it holds the folder
    return record if _alive(pid) and pid != os.getpid() else None


@contextlib.contextmanager
def output_lock(out: str | os.PathLike) -> Iterator[None]:
    """Hold the lock of output folder `out` for the duration of the block; refuse if another live command holds it."""
    lock = lock_path(out)
    if not os.path.isdir(lock.parent):  # (os.path: no exception for a parent name beyond the system's limits)
        yield  # the parent does not exist: the command's own output checks will say so
        return
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": " ".join(["rankwise", *sys.argv[1:]])[:500]}
    for _ in range(2):  # a stale lock is removed once, then taken with O_EXCL like a fresh one
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(lock)
            if holder is not None:
                raise InvalidInputError(
                    f"{out} is being written by another rankwise command (pid {holder.get('pid')} on {holder.get('host')}, "
                    f"started {holder.get('started')}: {holder.get('command')}); wait for it to finish or choose another "
                    f"output folder (if that process is gone, delete {lock})") from None
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
            continue
        except OSError:
            yield  # an unwritable parent: the command's own output checks refuse it in words
            return
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f)
        break
    else:
        raise InvalidInputError(f"{out}: could not take its lock {lock} (another command took it at the same moment); retry")
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if json.loads(lock.read_text(encoding="utf-8"))["pid"] == os.getpid():  # ours still (not taken over)
                lock.unlink()
