"""The file system's limits on names and paths, checked on a path before anything touches it.

A name longer than NAME_MAX (255 bytes on most Linux file systems) or a path longer than PATH_MAX cannot even be
looked at: `Path.exists()` raises OSError(ENAMETOOLONG) instead of answering. And an output whose own name fits may
still fail at the very end, when the atomic writer creates its longer temporary beside it (`core.temp_names`).
`check_path_limits` says so in words first. Torch-free (the CLI runs it before any heavy import).
"""

from __future__ import annotations

import os
from pathlib import Path

from rankwise.core.temp_names import temporary_name_bytes
from rankwise.errors import InvalidInputError

FALLBACK_NAME_MAX = 255  # where pathconf cannot say (POSIX's common value)
FALLBACK_PATH_MAX = 4096
# Bytes of path left for what is written inside an output folder (its files, and their own temporaries): the
# folder's path plus this must fit PATH_MAX.
CONTENT_MARGIN = 256


def _limit(folder: str, name: str, fallback: int) -> int:
    try:
        value = os.pathconf(folder, name)
    except (OSError, ValueError):
        return fallback
    return value if isinstance(value, int) and value > 0 else fallback


def _nearest_folder(path: str) -> str:
    """The nearest existing folder at or above `path` (os.path.isdir answers False, not an error, for names too
    long to look up)."""
    folder = path
    while not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return folder


def shown(name: str | os.PathLike) -> str:
    """A name or path short enough for a message: over-long ones are cut in the middle, with their length."""
    name = os.fspath(name)
    return name if len(name) <= 80 else f"{name[:40]}...{name[-20:]} ({len(name)} characters)"


def check_path_limits(path: str | os.PathLike, what: str, temporary_sibling: bool = False,
                      content_margin: int = 0, output: bool = True) -> None:
    """Refuse `path` when a name in it is longer than the file system allows, or the whole path is.

    `what` starts the message (e.g. "--out DIR"); `temporary_sibling`: the path is written through an atomic
    temporary beside it, whose longer name must fit too; `content_margin`: bytes of path a folder output needs
    below it (its files); `output`: the path is to be written (else read: the advice differs).
    """
    advice = ": choose a shorter one" if output else ", so nothing of that name can exist: check the path"
    absolute = os.path.abspath(os.path.expanduser(os.fspath(path)))
    folder = _nearest_folder(absolute)
    name_max = _limit(folder, "PC_NAME_MAX", FALLBACK_NAME_MAX)
    for part in Path(absolute).parts[1:]:
        size = len(os.fsencode(part))
        if size > name_max:
            raise InvalidInputError(f"{what}: the name {shown(part)!r} has {size} bytes, more than the {name_max} this "
                                    f"file system allows for one name{advice}")
    name = os.path.basename(absolute)
    if temporary_sibling and name:
        size = temporary_name_bytes(name)
        if size > name_max:
            spare = size - len(os.fsencode(name))
            raise InvalidInputError(
                f"{what}: rankwise writes it atomically through a temporary beside it whose name adds {spare} bytes "
                f"({size} in all), more than the {name_max} this file system allows for one name: choose a name of at "
                f"most {name_max - spare} bytes")
    path_max = _limit(folder, "PC_PATH_MAX", FALLBACK_PATH_MAX)
    size = len(os.fsencode(absolute)) + content_margin
    if size > path_max:
        raise InvalidInputError(f"{what}: the path has {len(os.fsencode(absolute))} bytes" +
                                (f" (plus about {content_margin} for what is written inside it)" if content_margin else "") +
                                f", more than the {path_max} this system allows for a path{advice}")
