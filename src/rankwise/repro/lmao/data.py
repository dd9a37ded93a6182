"""Few-shot wiki-topics on cached MiniLM prefixes: k training and k validation articles per class (the paper's
few-shot protocol: a new k-shot sample per seed), held-out articles from the eval split.

Every arm adapts only the top `top_layers` encoder layers (plus the head), so the layers below are a fixed function of
the input: their output is computed once per example and cached (`CachedFewShotTask`), and a training step runs only
the top layers. This is the documented top-layers variant of LMAO's W (see docs/methods/lmao.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.data import topic_task
from rankwise.training.encoder_top import EncoderTopClassifier


@dataclass(frozen=True)
class Cached:
    """The top layers' input h [N, T, D], its mask [N, T] and labels [N]."""

    h: torch.Tensor
    mask: torch.Tensor
    labels: torch.Tensor


# The classifier every arm trains: the encoder's top layers on cached inputs + a mean-pooled linear head.
TopLayersClassifier = EncoderTopClassifier


class CachedFewShotTask:
    """Classification on cached inputs: `train` is what the loop samples, `evaluation` what `evaluate` scores."""

    name = "wiki-topics few-shot (cached prefix)"
    metric = "accuracy"
    higher_is_better = True

    def __init__(self, train: Cached, evaluation: Cached) -> None:
        self.train, self.evaluation = train, evaluation

    @property
    def num_train(self) -> int:
        return self.train.h.size(0)

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"h": self.train.h[indices], "mask": self.train.mask[indices], "labels": self.train.labels[indices]}

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(module(batch["h"], batch["mask"]), batch["labels"])

    @torch.no_grad()
    def evaluate(self, module: nn.Module) -> dict[str, float]:
        was = module.training
        module.eval()
        try:
            e = self.evaluation
            logits = torch.cat([module(e.h[i : i + 128], e.mask[i : i + 128]) for i in range(0, e.h.size(0), 128)])
        finally:
            module.train(was)
        return {"eval_loss": float(F.cross_entropy(logits, self.evaluation.labels)),
                "accuracy": float((logits.argmax(-1) == self.evaluation.labels).float().mean())}


@torch.no_grad()
def cache_prefix(model, tokenizer, texts: list[str], labels: list[int], max_length: int, start: int) -> Cached:
    """The output of MiniLM's layers below `start` (the input of layer `start`) for each text, padded to max_length."""
    enc = tokenizer(texts, truncation=True, max_length=max_length, padding="max_length", return_tensors="pt")
    hs = [model(input_ids=enc["input_ids"][i : i + 64], attention_mask=enc["attention_mask"][i : i + 64],
                output_hidden_states=True).hidden_states[start] for i in range(0, len(texts), 64)]
    return Cached(torch.cat(hs), enc["attention_mask"].float(), torch.tensor(labels))


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
        self.test = cache_prefix(model, tokenizer, held.texts, held.labels, max_length, start)
        self.num_labels = len(self.pool.label_names)
        self._cache: dict[int, tuple[Cached, Cached]] = {}

    def split(self, seed: int) -> tuple[Cached, Cached]:
        if seed not in self._cache:
            tr, va = k_shot_split(self.k, seed)
            pick = lambda idx: ([self.pool.texts[i] for i in idx], [self.pool.labels[i] for i in idx])  # noqa: E731
            self._cache[seed] = (cache_prefix(self.model, self.tokenizer, *pick(tr), self.max_length, self.start),
                                 cache_prefix(self.model, self.tokenizer, *pick(va), self.max_length, self.start))
        return self._cache[seed]

    def tuning_task(self, seed: int) -> CachedFewShotTask:
        train, val = self.split(seed)
        return CachedFewShotTask(train, val)

    def final_task(self, seed: int) -> CachedFewShotTask:
        return CachedFewShotTask(self.split(seed)[0], self.test)
