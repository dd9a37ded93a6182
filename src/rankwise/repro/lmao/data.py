"""Few-shot wiki-topics on cached MiniLM prefixes: k training and k validation articles per class (the paper's
few-shot protocol: a new k-shot sample per seed), held-out articles from the eval split.

Every arm adapts only the top `top_layers` encoder layers (plus the head), so the layers below are a fixed function of
the input: their output is computed once per example and cached (`training.cached_classification`), and a training
step runs only the top layers. This is the documented top-layers variant of LMAO's W (see docs/methods/lmao.md).
"""

from __future__ import annotations

import random

from rankwise.data import topic_task
from rankwise.training.cached_classification import CachedClassificationTask, CachedInputs, cache_encoder_inputs

TASK_NAME = "wiki-topics few-shot (cached prefix)"
EVAL_BATCH = 128  # examples per evaluation forward (the committed reports' chunking)


def k_shot_split(k: int, seed: int) -> tuple[list[int], list[int]]:
    """(train, validation) indices into the wiki train split: k articles per class each, disjoint, drawn by `seed`."""
    pool = topic_task("train")
    by_class: dict[int, list[int]] = {}
    for i, y in enumerate(pool.labels):
        by_class.setdefault(int(y), []).append(i)
    rng = random.Random(seed)
    train, val = [], []
    for y in sorted(by_class):
        picked = rng.sample(by_class[y], min(2 * k, len(by_class[y])))
        train += picked[:k]
        val += picked[k : 2 * k]
    return train, val


class FewShotData:
    """Caches the held-out split once and each seed's k-shot train/validation sample on demand."""

    def __init__(self, model, tokenizer, k: int, test: int, max_length: int, start: int) -> None:
        self.model, self.tokenizer, self.k, self.max_length, self.start = model, tokenizer, k, max_length, start
        self.pool = topic_task("train")
        held = topic_task("eval", test)
        self.test = self._cache(held.texts, held.labels)
        self.num_labels = len(self.pool.label_names)
        self._splits: dict[int, tuple[CachedInputs, CachedInputs]] = {}

    def _cache(self, texts: list[str], labels: list[int]) -> CachedInputs:
        return cache_encoder_inputs(self.model, self.tokenizer, texts, labels, self.max_length, self.start)

    def split(self, seed: int) -> tuple[CachedInputs, CachedInputs]:
        if seed not in self._splits:
            tr, va = k_shot_split(self.k, seed)
            pick = lambda idx: ([self.pool.texts[i] for i in idx], [self.pool.labels[i] for i in idx])  # noqa: E731
            self._splits[seed] = (self._cache(*pick(tr)), self._cache(*pick(va)))
        return self._splits[seed]

    def tuning_task(self, seed: int) -> CachedClassificationTask:
        train, val = self.split(seed)
        return CachedClassificationTask(train, val, TASK_NAME, EVAL_BATCH)

    def final_task(self, seed: int) -> CachedClassificationTask:
        return CachedClassificationTask(self.split(seed)[0], self.test, TASK_NAME, EVAL_BATCH)
