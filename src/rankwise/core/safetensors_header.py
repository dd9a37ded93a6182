"""A safetensors file checked from its header alone: truncated, padded or garbled files are found without reading
(or loading) any tensor data, in microseconds whatever the file's size. Torch-free (`rankwise info` and the folder
checks of `models.folders` use it).

The format: 8 bytes, the little-endian size N of a JSON header; the header, `{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {...}}` with offsets into the data section that follows; and the
data, which the offsets must cover exactly (the safetensors library refuses any other file as "not fully covered").
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rankwise.errors import CorruptFileError

MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit on the header


def check_safetensors_file(path: str | os.PathLike) -> None:
    """Raise CorruptFileError, naming `path` and what is wrong, unless its header is valid JSON whose tensors'
    data_offsets end exactly where the file does."""
    path = Path(path)

    def damaged(why: str) -> CorruptFileError:
        return CorruptFileError(f"{path} is damaged: {why}; save or copy the model again")

    try:  # (the damage is raised after the reads: CorruptFileError is an OSError too)
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else None
            text = f.read(n) if n is not None and n <= min(size - 8, MAX_HEADER_BYTES) else None
    except OSError as e:
        raise CorruptFileError(f"{path} cannot be read ({e.strerror or e}): check its permissions") from e
    if n is None:
        raise damaged(f"it has {size} bytes, fewer than a safetensors header's 8")
    if text is None:
        raise damaged(f"its header claims {n:,} bytes, more than the {size - 8:,} after the size field (truncated, or "
                      "not a safetensors file)")
    try:
        header = json.loads(text.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise damaged(f"its header is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise damaged("its header is not a JSON object")
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise damaged(f"tensor {name!r} has no valid data_offsets in the header")
        end = max(end, offsets[1])
    expected = 8 + n + end
    if size < expected:
        raise damaged(f"it has {size:,} bytes, and its header describes {expected:,}: it is truncated (an interrupted "
                      "copy or download?)")
    if size > expected:
        raise damaged(f"{size - expected:,} bytes follow the tensors its header describes")
