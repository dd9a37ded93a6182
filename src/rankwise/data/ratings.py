"""MovieLens ratings (the "small" set: 100,004 ratings, 671 users, 9,066 movies, with timestamps), read from the
R package `dslabs` as Debian ships it (`r-cran-dslabs`), without R: `rankwise.data.rdata` parses its lazy-load data.

    ratings = load_movielens()          # Ratings: user, item, rating, timestamp tensors [N], sorted by time
    ratings.num_users, ratings.num_items, ratings.titles[item]

Where the package is looked for, in order: `$RANKWISE_DSLABS` (the package's `data/` folder, the package folder, or
a folder the .deb was extracted into), the copy `make install` extracts into the virtual environment
(`<venv>/debian/usr/lib/R/site-library/dslabs/data`), and a system-wide R installation. Parsed tensors are cached
(`core.cache`, keyed by the file's size and modification time), so later loads skip the parse.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rankwise.core.cache import cache_key, cached_entry, store_entry
from rankwise.core.io import load_tensors, save_tensors_atomic, write_json_atomic
from rankwise.data.rdata import LazyLoadDB, data_frame
from rankwise.errors import CorruptFileError, InvalidInputError, MissingPackageError

ENV_VAR = "RANKWISE_DSLABS"
PACKAGE_DATA = Path("usr/lib/R/site-library/dslabs/data")
CACHE_NAMESPACE = "ratings"
CACHE_VERSION = 1
HOW_TO_GET = ("get it with `apt-get download r-cran-dslabs && dpkg -x r-cran-dslabs_*.deb DIR` and set "
              f"{ENV_VAR}=DIR (or run `make install`, which extracts it into .venv/debian/)")


@dataclass(frozen=True)
class Ratings:
    """Interactions sorted by (timestamp, user, item). Users and items are dense 0-based indices; `user_ids` and
    `movie_ids` [num_users] / [num_items] map them back to MovieLens ids, `titles` [num_items] names the movies."""

    user: torch.Tensor  # [N] int64
    item: torch.Tensor  # [N] int64
    rating: torch.Tensor  # [N] float32, 0.5 .. 5 stars
    timestamp: torch.Tensor  # [N] int64, seconds since 1970
    user_ids: torch.Tensor  # [num_users] int64
    movie_ids: torch.Tensor  # [num_items] int64
    titles: tuple[str, ...]

    @property
    def num_users(self) -> int:
        return int(self.user_ids.numel())

    @property
    def num_items(self) -> int:
        return int(self.movie_ids.numel())

    def __len__(self) -> int:
        return int(self.user.numel())


def dslabs_data_folder() -> Path:
    """The dslabs `data/` folder (with Rdata.rdx and Rdata.rdb); MissingPackageError saying how to get it if absent."""
    tried: list[Path] = []
    override = os.environ.get(ENV_VAR)
    if override:
        root = Path(override)
        for candidate in (root, root / "data", root / PACKAGE_DATA):
            if (candidate / "Rdata.rdx").is_file():
                return candidate
        raise MissingPackageError(f"{ENV_VAR}={override} holds no dslabs data (no Rdata.rdx in it, its data/ or "
                                  f"{PACKAGE_DATA}); {HOW_TO_GET}")
    for candidate in (Path(sys.prefix) / "debian" / PACKAGE_DATA, Path("/") / PACKAGE_DATA):
        tried.append(candidate)
        if (candidate / "Rdata.rdx").is_file():
            return candidate
    raise MissingPackageError(f"the MovieLens ratings need the Debian package r-cran-dslabs (looked in "
                              f"{', '.join(map(str, tried))}); {HOW_TO_GET}")


def load_movielens(folder: str | Path | None = None, use_cache: bool = True) -> Ratings:
    """The dslabs `movielens` data frame as tensors (see `Ratings`); `folder` overrides the package search."""
    data = Path(folder) if folder is not None else dslabs_data_folder()
    rdb = data / "Rdata.rdb"
    if not rdb.is_file():
        raise MissingPackageError(f"{rdb} does not exist; {HOW_TO_GET}")
    stat = rdb.stat()
    key = cache_key(what="dslabs-movielens", size=stat.st_size, mtime=stat.st_mtime_ns, version=CACHE_VERSION)
    entry = cached_entry(CACHE_NAMESPACE, key) if use_cache else None
    if entry is not None:
        try:
            return _from_cache(entry)
        except (CorruptFileError, KeyError, ValueError):
            pass  # unreadable despite its manifest (another version's layout): parse again
    ratings = parse_movielens(data)
    if use_cache:
        store_entry(CACHE_NAMESPACE, key, lambda tmp: _to_cache(tmp, ratings))
    return ratings


def parse_movielens(folder: str | Path) -> Ratings:
    """Parse the `movielens` data frame of the dslabs lazy-load database in `folder` (no cache)."""
    frame = data_frame(LazyLoadDB(folder).load("movielens"), "dslabs movielens")
    missing = {"userId", "movieId", "rating", "timestamp", "title"} - set(frame)
    if missing:
        raise CorruptFileError(f"dslabs movielens lacks the column(s) {sorted(missing)}; it has {sorted(frame)}")
    users = np.asarray(frame["userId"], dtype=np.int64)
    movies = np.asarray(frame["movieId"], dtype=np.int64)
    stars = np.asarray(frame["rating"], dtype=np.float64)
    times = np.asarray(frame["timestamp"], dtype=np.int64)
    na = -(2**31)
    if (users == na).any() or (movies == na).any() or (times == na).any() or np.isnan(stars).any():
        raise CorruptFileError("dslabs movielens has missing user, movie, rating or timestamp values")
    user_ids, user = np.unique(users, return_inverse=True)
    movie_ids, item = np.unique(movies, return_inverse=True)
    titles = [""] * len(movie_ids)
    for i, t in zip(item.tolist(), frame["title"]):
        titles[i] = titles[i] or (t or "")
    order = np.lexsort((item, user, times))  # time first; ties (ratings entered in one second) by user, then item
    as_long = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))  # noqa: E731
    return Ratings(as_long(user[order]), as_long(item[order]), torch.from_numpy(stars[order].astype(np.float32)),
                   as_long(times[order]), as_long(user_ids), as_long(movie_ids), tuple(titles))


def _to_cache(folder: Path, r: Ratings) -> None:
    save_tensors_atomic(folder / "ratings.safetensors", {"user": r.user, "item": r.item, "rating": r.rating, "timestamp": r.timestamp,
                                                         "user_ids": r.user_ids, "movie_ids": r.movie_ids})
    write_json_atomic(folder / "titles.json", list(r.titles))


def _from_cache(folder: Path) -> Ratings:
    t = load_tensors(folder / "ratings.safetensors")
    titles = json.loads((folder / "titles.json").read_text(encoding="utf-8"))
    if len(titles) != t["movie_ids"].numel():
        raise CorruptFileError(f"{folder}: {len(titles)} titles for {t['movie_ids'].numel()} movies")
    return Ratings(t["user"], t["item"], t["rating"], t["timestamp"], t["user_ids"], t["movie_ids"], tuple(titles))


def check_known(users: torch.Tensor, items: torch.Tensor, num_users: int, num_items: int, what: str = "ratings") -> None:
    """Refuse user or item indices outside [0, num_users) / [0, num_items): a model cannot score what it never saw."""
    for name, ids, n in (("user", users, num_users), ("item", items, num_items)):
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
            bad = ids[(ids < 0) | (ids >= n)].unique()[:5].tolist()
            raise InvalidInputError(f"{what}: unknown {name} id(s) {bad} (the model knows {name}s 0..{n - 1}); "
                                    f"map them with the vocabulary the model was trained with, or drop them")
