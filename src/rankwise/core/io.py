"""Atomic writes and validated reads: safetensors for tensors, versioned JSON for configs.

A write goes to a temporary file in the destination folder and is renamed into place, so a reader sees either the
old file or the complete new one, never a partial one. Folders of several files carry a manifest with each file's
size and SHA-256; `verify_manifest` detects truncation and corruption before anything is loaded.

Every model folder rankwise writes (conversions, quantized models, exports, fine-tuned models, adapters, caches,
checkpoints) goes through `save_model_folder`: a writer callback fills a temporary folder, the manifest is added,
and the folder is renamed into place (one atomic exchange on Linux). An existing folder is replaced only when it
is empty or a rankwise folder of the same kind whose every file the manifest lists, or when the caller passes
`overwrite` (the user's `--overwrite`): a write never deletes what the program did not write unless told to. A
file where a folder should go is always refused. Written files and folders follow the umask, as `open()` would.
Durability: a file (or every file of a folder) is fsync'ed before it is renamed into place and the parent folder
after, so that a power loss right after a write leaves the old or the new version, not an empty file of the new name.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from rankwise.core.temp_names import HOST, temp_prefix
from rankwise.errors import CorruptFileError, InvalidInputError

MANIFEST_NAME = "rankwise-manifest.json"
KIND_KEY = "rankwise_kind"  # in the manifest: what the folder is, so a write never replaces another kind
DEFAULT_KIND = "model"


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it onto `path`, on failure remove it.

    The file gets the mode a plain `open()` would give it (0666 less the umask), not tempfile's 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(path)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # After the writer: some (safetensors) recreate the file rather than write into the one mkstemp made.
        os.chmod(tmp_path, 0o666 & ~_umask())
        _fsync(tmp_path)
        os.replace(tmp_path, path)
        _fsync(path.parent)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextmanager
def atomic_dir(path: str | os.PathLike, kind: str | None = None, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; on success it replaces `path` whole, on failure it is removed.

    An existing `path` must be empty or a rankwise folder of the same `kind` holding only files its manifest lists
    (checked before and again right after the writer runs); anything else raises InvalidInputError and nothing is
    deleted — unless `overwrite`, the user's explicit consent to replace a folder rankwise did not write. A file (or a
    link) at `path` is always refused. The replacement is one atomic exchange of the two folders (Linux
    renameat2), so at every instant `path` holds either the complete old folder or the complete new one.
    """
    path = Path(path)
    check_output_folder(path, kind, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(path)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # a folder follows the umask like mkdir's, not mkdtemp's 0700
        yield tmp
        check_output_folder(path, kind, overwrite)
        _fsync_tree(tmp)
        if path.exists() and path.is_dir() and any(path.iterdir()):
            if not _exchange(tmp, path):
                # No atomic exchange here (not Linux, or a file system without it): park the old folder under a
                # fresh name, then rename; a kill between the two renames leaves the old folder parked beside it.
                old = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".old", dir=path.parent))
                os.replace(path, old)
                os.replace(tmp, path)
                shutil.rmtree(old, ignore_errors=True)
        else:
            if path.is_dir():
                path.rmdir()  # an empty folder (the check above saw nothing in it)
            os.replace(tmp, path)
        _fsync(path.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)  # a failed write, or the old folder after the exchange


def _fsync(path: Path) -> None:
    """Flush a file's (or a folder's entries') data to the disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    """fsync every file and folder under `folder`, deepest first, then `folder` itself."""
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                _fsync(Path(root) / name)
        _fsync(Path(root))


def check_output_folder(path: str | os.PathLike, kind: str | None = None, overwrite: bool = False) -> None:
    """Raise InvalidInputError unless `path` may receive a rankwise folder of `kind` (see `atomic_dir`).

    Cheap and side-effect free: commands call it on `--out` before any work, so a refusal costs nothing.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_dir():
        raise InvalidInputError(f"{path} exists and is not a folder: rankwise writes a folder there; remove it or choose another path")
    files = [p for p in path.rglob("*") if p.is_file() or p.is_symlink()]
    if not files or overwrite:
        return
    consent = "or pass --overwrite (overwrite=True) to replace it"
    manifest = path / MANIFEST_NAME
    if not manifest.is_file():
        raise InvalidInputError(
            f"{path} already exists and was not written by rankwise (it has no {MANIFEST_NAME}); rankwise replaces only "
            f"its own folders: remove it, choose another path, {consent}"
        )
    try:
        saved = json.loads(manifest.read_text(encoding="utf-8"))
        listed = set(saved["files"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InvalidInputError(
            f"{manifest} is unreadable ({e}), so rankwise cannot tell which files in {path} it wrote: remove the folder, "
            f"choose another path, {consent}"
        ) from e
    found = saved.get(KIND_KEY)  # absent in folders written before kinds were recorded: any kind may replace them
    if kind is not None and found is not None and found != kind:
        raise InvalidInputError(
            f"{path} holds a rankwise {found!r} folder, not a {kind!r} one: choose another path, {consent}"
        )
    foreign = sorted(str(p.relative_to(path)) for p in files if p != manifest and str(p.relative_to(path)) not in listed)
    if foreign:
        raise InvalidInputError(
            f"{path} holds {len(foreign)} file(s) rankwise did not write ({', '.join(foreign[:3])}); replacing the folder "
            f"would delete them: move them elsewhere, choose another path, {consent}"
        )


def _umask() -> int:
    """The process umask, read without changing it where the system allows (changing it races other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_HOST = HOST  # `core.temp_names`: the CLI checks an output name against the same temporary-name formula


def _temp_prefix(path: Path) -> str:
    """`.NAME.rwPID@HOST.`: temporaries name their writer, so a later write can tell which ones a killed run left."""
    return temp_prefix(path.name)


def temporary_name(path: str | os.PathLike, tag: str = "") -> Path:
    """A fresh sibling name for `path` that `sweep_temporaries` removes once this process is gone."""
    path = Path(path)
    return path.with_name(f"{_temp_prefix(path)}{tag}{time.monotonic_ns()}.old")


def _sweep_stale(path: Path) -> None:
    sweep_temporaries(path.parent, path.name)


def sweep_temporaries(folder: str | os.PathLike, name: str | None = None) -> None:
    """Remove the temporaries in `folder` (of `name` only, if given) left by writers on this host that no longer run."""
    stem = re.escape(name) if name is not None else ".+"
    pattern = re.compile(rf"^\.{stem}\.rw(\d+)@{re.escape(_HOST)}\..*\.(tmp|old)$")
    try:
        siblings = list(Path(folder).iterdir())
    except OSError:
        return
    for p in siblings:
        m = pattern.match(p.name)
        if m is None or _alive(int(m.group(1))):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (renameat2 RENAME_EXCHANGE); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def save_model_folder(
    path: str | os.PathLike,
    write_fn: Callable[[Path], object],
    format_name: str | None = None,
    extra_manifest: Mapping[str, Any] | None = None,
    *,
    kind: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a model folder atomically: `write_fn(tmp)` fills a temporary folder, then the manifest (sizes, SHA-256,
    `rankwise_format` = format_name, `rankwise_kind` = kind, extra_manifest) is added and the folder renamed onto
    `path`. Returns `path`.

    `kind` names what the folder is ("adapter", "train-checkpoint", a format name, ...; default `format_name`, else
    "model"): an existing rankwise folder is replaced only by one of the same kind. If `write_fn` raises, nothing is
    left at `path` (a folder already there is untouched). An existing `path` is replaced only when it is empty or
    was written by rankwise, or with `overwrite` (see `atomic_dir`); a file at `path` is always refused.
    """
    path = Path(path)
    kind = kind or format_name or DEFAULT_KIND
    with atomic_dir(path, kind, overwrite) as tmp:
        write_fn(tmp)
        if not any(p.is_file() for p in tmp.rglob("*")):
            raise InvalidInputError(f"the writer of {path} wrote no files: nothing to save")
        extra = {"rankwise_format": format_name} if format_name is not None else {}
        write_manifest(tmp, extra={**extra, KIND_KEY: kind, **(dict(extra_manifest) if extra_manifest else {})})
    return path


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"cannot write {type(obj).__name__} as JSON")


def read_json(path: str | os.PathLike) -> Any:
    """Read JSON, turning a missing or malformed file into a clear `CorruptFileError`."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise CorruptFileError(f"{path} does not exist") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"{path} is not valid JSON ({e}); delete it and rebuild") from e
    except OSError as e:  # unreadable (permissions, a folder of that name, ...): said in words, not a traceback
        raise CorruptFileError(f"{path} cannot be read ({e.strerror or e}): check its permissions") from e


def write_versioned_config(path: str | os.PathLike, kind: str, version: int, fields: Mapping[str, Any]) -> None:
    """A JSON config that records what it is (`kind`) and its schema `version`, so loaders can refuse strangers."""
    write_json_atomic(path, {"kind": kind, "version": version, **fields})


def read_versioned_config(path: str | os.PathLike, kind: str, max_version: int) -> dict[str, Any]:
    config = read_json(path)
    if not isinstance(config, dict) or config.get("kind") != kind:
        raise CorruptFileError(f"{path} is not a {kind!r} config (found kind={config.get('kind') if isinstance(config, dict) else None!r})")
    version = config.get("version")
    if not isinstance(version, int) or version > max_version:
        raise CorruptFileError(f"{path} has {kind} config version {version!r}; this rankwise reads up to {max_version}: upgrade rankwise")
    return config


def save_tensors_atomic(path: str | os.PathLike, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> None:
    """Save tensors as safetensors (contiguous copies, shared storage broken) with an atomic rename."""
    plain = {name: t.detach().contiguous().clone() if _shares_storage(t, tensors) else t.detach().contiguous() for name, t in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(plain, str(tmp), metadata=dict(metadata) if metadata else None)


def _shares_storage(t: torch.Tensor, tensors: Mapping[str, torch.Tensor]) -> bool:
    ptr = t.untyped_storage().data_ptr()
    return sum(1 for o in tensors.values() if o.untyped_storage().data_ptr() == ptr) > 1


def load_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Load a safetensors file; a missing, truncated or garbled file raises `CorruptFileError`."""
    path = Path(path)
    if not path.is_file():
        raise CorruptFileError(f"{path} does not exist")
    try:
        return load_file(str(path))
    except PermissionError as e:
        raise CorruptFileError(f"{path} cannot be read ({e.strerror or e}): check its permissions") from e
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CorruptFileError(f"{path} is not a readable safetensors file ({e}); delete it and rebuild") from e


def sha256_of(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def folder_digest(folder: str | os.PathLike) -> str:
    """One SHA-256 over every file in `folder` (relative name and content; the manifest excluded, since it is a
    record about the files rather than one of them): two folders with the same digest hold the same model."""
    folder = Path(folder)
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST_NAME:
            h.update(f"{p.relative_to(folder).as_posix()}\0{sha256_of(p)}\n".encode())
    return h.hexdigest()


def write_manifest(folder: str | os.PathLike, extra: Mapping[str, Any] | None = None) -> None:
    """Record size and SHA-256 of every file in `folder` (the manifest itself excluded)."""
    folder = Path(folder)
    files = {
        str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": sha256_of(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }
    write_json_atomic(folder / MANIFEST_NAME, {"files": files, **(dict(extra) if extra else {})})


def verify_manifest(folder: str | os.PathLike, check_hashes: bool = True) -> dict[str, Any]:
    """Check every file listed in the folder's manifest; raise `CorruptFileError` on any mismatch."""
    folder = Path(folder)
    manifest = read_json(folder / MANIFEST_NAME)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        raise CorruptFileError(f"{folder / MANIFEST_NAME} lists no files")
    for name, expected in files.items():
        p = folder / name
        if not isinstance(expected, dict) or not isinstance(expected.get("bytes"), int) or not isinstance(expected.get("sha256"), str):
            raise CorruptFileError(f"{folder / MANIFEST_NAME} lists {name!r} without its size and SHA-256 (edited?)")
        if not p.is_file():
            raise CorruptFileError(f"{p} is missing")
        if p.stat().st_size != expected["bytes"]:
            raise CorruptFileError(f"{p} has {p.stat().st_size} bytes, expected {expected['bytes']} (truncated?)")
        try:
            digest = sha256_of(p) if check_hashes else None
        except OSError as e:  # a file that cannot be read cannot be vouched for: callers rebuild or refuse it
            raise CorruptFileError(f"{p} cannot be read ({e.strerror or e}): check its permissions") from e
        if check_hashes and digest != expected["sha256"]:
            raise CorruptFileError(f"{p} does not match its recorded SHA-256 (corrupted)")
    return manifest
