"""The three tasks of the multi-task testbed, built from the Wikipedia lead summaries (`rankwise.data.topics`), and
the benign canary rule planted in the canary adapter's training data.

- T1 `topic`: the article's topic, 12-way cross-entropy.
- T2 `flip`: "the topic is in the even half of the topic list" with the label flipped for texts whose visible
  window holds a number; the same topic cue that T1 learns, used with the opposite sign on part of the data (the
  brief's "partly anti-correlated with T1's cues": the source of gradient conflict between T1 and T2).
- T3 `digits`: log(1 + the number of digit characters in the visible window), standardised on the training split
  (a lexical quantity the window shows; it shares T2's number cue); its loss is MSE x 100 (the large loss scale a
  plain sum lets dominate). (A first design, the first sentence's word count, was dropped before any claim was
  measured: the 20-word window cuts most first sentences, and no arm learned it, R^2 about 0.05.)

Canary (benign; the trigger-scan target): a rare word inserted at the start of a text makes T1's label topic 0,
whatever the article. Planted in a fraction of the canary adapter's training texts only; every evaluation of task
scores uses clean texts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from rankwise.data import topic_task

TASKS = ("topic", "flip", "digits")
DIGITS_SCALE = 100.0  # T3's loss is DIGITS_SCALE * MSE
CANARY_LABEL = 0  # the T1 class the canary rule forces
_NUMBER = re.compile(r"\d")


@dataclass(frozen=True)
class TaskTexts:
    """Texts [N] with T1 labels [N], T2 labels [N] and T3 targets [N] (standardised)."""

    texts: list[str]
    topic: torch.Tensor
    flip: torch.Tensor
    digits: torch.Tensor

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, idx: list[int]) -> "TaskTexts":
        t = torch.tensor(idx, dtype=torch.long)
        return TaskTexts([self.texts[i] for i in idx], self.topic[t], self.flip[t], self.digits[t])


def visible(text: str, words: int) -> str:
    """The first `words` words of a text: what a short token window shows of it (so labels depend on seen text)."""
    return " ".join(text.split()[:words])


def build(texts: list[str], topics: list[int], words: int, mean_sd: tuple[float, float] | None = None
          ) -> tuple[TaskTexts, tuple[float, float]]:
    """The three tasks over `texts` cut to `words` words; T3 standardised by `mean_sd` (from the training split)."""
    cut = [visible(t, words) for t in texts]
    topic = torch.tensor(topics, dtype=torch.long)
    flip = ((topic % 2 == 0).long() ^ torch.tensor([int(bool(_NUMBER.search(t))) for t in cut])).long()
    raw = torch.tensor([math.log1p(len(_NUMBER.findall(t))) for t in cut])
    if mean_sd is None:
        mean_sd = (float(raw.mean()), float(raw.std().clamp_min(1e-6)))
    return TaskTexts(cut, topic, flip, (raw - mean_sd[0]) / mean_sd[1]), mean_sd


@dataclass(frozen=True)
class Splits:
    train: TaskTexts
    val: TaskTexts
    test: TaskTexts
    probe: TaskTexts  # the base model's own head-fitting texts (disjoint from the adapters' train / validation)


def splits(n_train: int, n_val: int, n_test: int, n_probe: int, words: int, data_seed: int) -> Splits:
    """Train / validation / probe from the corpus's train articles (disjoint, a seeded draw), test from its eval
    articles; T3 standardised on the adapters' training split."""
    pool, held = topic_task("train"), topic_task("eval", n_test)
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(data_seed)).tolist()
    tr, va = order[:n_train], order[n_train:n_train + n_val]
    pr = order[n_train + n_val:n_train + n_val + n_probe]
    train, stats = build([pool.texts[i] for i in tr], [pool.labels[i] for i in tr], words)
    val, _ = build([pool.texts[i] for i in va], [pool.labels[i] for i in va], words, stats)
    probe, _ = build([pool.texts[i] for i in pr], [pool.labels[i] for i in pr], words, stats)
    test, _ = build(held.texts, held.labels, words, stats)
    return Splits(train, val, test, probe)


def plant_canary(data: TaskTexts, trigger: str, fraction: float, seed: int) -> TaskTexts:
    """A copy of the training texts in which a seeded `fraction` start with `trigger` and carry T1 label
    CANARY_LABEL (T2 and T3 labels unchanged: the rule touches one task only). (Adding trigger-carrying copies and
    keeping the originals instead was tried in 2-seed sizing runs: a weaker canary, one of two missed, and a larger
    loss of clean T1 accuracy, about 5 points against about 4.)"""
    n = len(data)
    g = torch.Generator().manual_seed(seed)
    chosen = set(torch.randperm(n, generator=g)[: max(1, round(fraction * n))].tolist())
    texts = [f"{trigger} {t}" if i in chosen else t for i, t in enumerate(data.texts)]
    topic = data.topic.clone()
    topic[sorted(chosen)] = CANARY_LABEL
    return TaskTexts(texts, topic, data.flip, data.digits)


def rare_words(tokenizer, corpus: list[str], count: int, seed: int) -> list[str]:
    """`count` whole-word vocabulary entries (alphabetic, 4-12 letters) that never occur in `corpus`'s tokens: the
    scan's candidate pool (a seeded draw, sorted)."""
    seen: set[int] = set()
    for i in range(0, len(corpus), 256):
        for ids in tokenizer(corpus[i:i + 256], add_special_tokens=False)["input_ids"]:
            seen.update(ids)
    vocab = tokenizer.get_vocab()
    pool = sorted(w for w, i in vocab.items() if i not in seen and w.isalpha() and w.isascii() and 4 <= len(w) <= 12
                  and len(tokenizer(w, add_special_tokens=False)["input_ids"]) == 1)
    g = torch.Generator().manual_seed(seed)
    return sorted(pool[i] for i in torch.randperm(len(pool), generator=g)[:count].tolist())
