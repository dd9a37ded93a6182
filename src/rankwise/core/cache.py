"""Where rankwise keeps derived files (dequantized weights, calibration statistics), and how they are keyed."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

CACHE_ENV = "RANKWISE_CACHE"


def cache_dir(*parts: str) -> Path:
    """`$RANKWISE_CACHE/<parts>` (default `~/.cache/rankwise`), created on demand."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rankwise")
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_key(**fields: Any) -> str:
    """A short stable hash of JSON-serialisable fields (sorted keys), for cache file names."""
    blob = json.dumps(fields, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]
