"""Where rankwise keeps derived files (dequantized weights, calibration statistics), how they are keyed, checked
and evicted.

Layout: `$RANKWISE_CACHE/<namespace>/<name>/` (default root `~/.cache/rankwise`), one folder per entry, each written
by `core.io.save_model_folder` (atomic, with a manifest of sizes and SHA-256s).

Derived entries (`store_entry` / `cached_entry`, e.g. calibration statistics) are checked against their SHA-256s on
every load: a corrupted entry is discarded with a warning and the caller recomputes it (it is derived data, so a
recomputation is always possible and always right). A failed or killed run leaves no partial entry (the write is
atomic; temporaries of dead writers are swept). Their total size is capped at `$RANKWISE_CACHE_MAX_BYTES` (default
4 GiB; 0 disables the cap): after each write the least recently used entries are evicted until the total fits. The
entry just written is never evicted, so one entry larger than the cap still works (alone).

Other entries (the dequantized SmolLM2 weights and its tokenizer, written by `rankwise.models`) are verified by
their own loaders, count towards `rankwise cache list`, and are removed only by `rankwise cache clear`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankwise.core.io import (MANIFEST_NAME, read_json, save_model_folder, sweep_temporaries, temporary_name, verify_manifest,
                              write_json_atomic)
from rankwise.errors import CorruptFileError, InvalidInputError

CACHE_ENV = "RANKWISE_CACHE"
MAX_BYTES_ENV = "RANKWISE_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 4 * 2**30
ENTRY_KIND = "cache-entry"  # the manifest kind of a derived (evictable, hash-checked) entry


def cache_root() -> Path:
    """`$RANKWISE_CACHE` (default `~/.cache/rankwise`); not created."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rankwise")


ROOT_MARKER = ".rankwise-cache"  # in the root: this folder is rankwise's cache (what `cache clear` may touch)


def cache_dir(*parts: str) -> Path:
    """`$RANKWISE_CACHE/<parts>`, created on demand; the root gets its marker on first use."""
    root = cache_root()
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    if not (root / ROOT_MARKER).is_file():
        write_json_atomic(root / ROOT_MARKER, {"rankwise_cache": 1})
    return path


def cache_key(**fields: Any) -> str:
    """A short stable hash of JSON-serialisable fields (sorted keys), for cache file names."""
    blob = json.dumps(fields, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def max_cache_bytes() -> int:
    """The cap on derived entries, from `$RANKWISE_CACHE_MAX_BYTES` (bytes; suffixes K, M, G accepted; 0: no cap)."""
    raw = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(raw[-1].upper(), 1)
    number = raw[:-1] if scale > 1 else raw
    try:
        value = int(float(number) * scale)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidInputError(f"{MAX_BYTES_ENV}={raw!r} is not a size in bytes (e.g. 4000000000, 4G; 0 for no cap)")
    return value


def cached_entry(namespace: str, key: str) -> Path | None:
    """The folder of entry `key` if it exists and every file matches its SHA-256; else None.

    A corrupted or incomplete entry is removed with a warning (the caller recomputes and stores it again). A hit
    marks the entry as just used, for least-recently-used eviction.
    """
    folder = cache_root() / namespace / key
    if not folder.is_dir():
        return None
    try:
        verify_manifest(folder)
    except CorruptFileError as e:
        warnings.warn(f"discarding a corrupted cache entry ({e}); it will be recomputed", stacklevel=2)
        _remove(folder)
        return None
    _touch(folder)
    return folder


def store_entry(namespace: str, key: str, write_fn: Callable[[Path], object]) -> Path:
    """Write entry `key` atomically (`write_fn(tmp)` fills the folder), then evict down to the cap. Returns it."""
    folder = cache_dir(namespace) / key
    save_model_folder(folder, write_fn, kind=ENTRY_KIND, overwrite=True)  # a cache entry is ours by its name
    _touch(folder)
    evict(max_cache_bytes(), keep=folder)
    return folder


@dataclass(frozen=True)
class CacheEntry:
    namespace: str
    name: str
    path: Path
    bytes: int
    last_used: float  # seconds since the epoch
    derived: bool  # True: a hash-checked entry that eviction may remove


def cache_entries() -> list[CacheEntry]:
    """Every entry under the cache root, least recently used first. An entry is a folder rankwise wrote: it holds a
    rankwise manifest. Anything else there (a user's files, another tool's cache) is neither listed nor removed."""
    root = cache_root()
    entries = []
    if not root.is_dir():
        return entries
    for ns in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")):
        for p in sorted(ns.iterdir()):
            if p.name.startswith(".") or p.is_symlink() or not (p / MANIFEST_NAME).is_file():
                continue  # a temporary of a write in progress (swept on the next write), or not rankwise's
            entries.append(CacheEntry(ns.name, p.name, p, _size(p), _last_used(p), _is_derived(p)))
    return sorted(entries, key=lambda e: e.last_used)


def evict(max_bytes: int, keep: Path | None = None) -> list[CacheEntry]:
    """Remove least recently used derived entries until they total at most `max_bytes` (0: no cap). Returns them."""
    root = cache_root()
    for ns in (p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ():
        sweep_temporaries(ns)  # partial entries of killed runs
    if max_bytes <= 0:
        return []
    derived = [e for e in cache_entries() if e.derived]
    total = sum(e.bytes for e in derived)
    evicted = []
    for e in derived:  # oldest first
        if total <= max_bytes:
            break
        if keep is not None and e.path == keep:
            continue
        _remove(e.path)
        total -= e.bytes
        evicted.append(e)
    return evicted


def clear_cache(namespace: str | None = None) -> list[CacheEntry]:
    """Remove every entry (or those of `namespace`); returns what was removed."""
    if namespace is not None and (not namespace or "/" in namespace or namespace.startswith(".")):
        raise InvalidInputError(f"not a cache namespace: {namespace!r}")
    root = cache_root()
    if root.is_dir() and not (root / ROOT_MARKER).is_file():
        raise InvalidInputError(
            f"{root} is not a rankwise cache (it has no {ROOT_MARKER} marker): nothing was deleted. Check "
            f"${CACHE_ENV}; a cache rankwise made gets its marker the first time it writes there")
    removed = [e for e in cache_entries() if namespace is None or e.namespace == namespace]
    for e in removed:
        _remove(e.path)
    return removed


def _remove(path: Path) -> None:
    """Take the entry out of its namespace in one rename (readers then miss it whole), then delete it."""
    gone = temporary_name(path, "removed")  # swept by a later write should this process die mid-delete
    try:
        os.replace(path, gone)
    except FileNotFoundError:
        return
    if gone.is_dir() and not gone.is_symlink():
        shutil.rmtree(gone, ignore_errors=True)
    else:
        gone.unlink(missing_ok=True)


def _touch(folder: Path) -> None:
    try:
        os.utime(folder)
    except OSError:
        pass  # a read-only cache still serves hits; only its eviction order suffers


def _last_used(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _is_derived(path: Path) -> bool:
    manifest = path / MANIFEST_NAME
    if not manifest.is_file():
        return False
    try:
        return read_json(manifest).get("rankwise_kind") == ENTRY_KIND
    except (CorruptFileError, AttributeError):
        return False
