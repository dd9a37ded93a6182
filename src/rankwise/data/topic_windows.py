"""Next-token windows of one wiki topic: its `train` articles for fine-tuning, its `calibration` articles as the
validation set (they are disjoint from both others: `rankwise.data.wiki`'s article-level hash splits) and its `eval`
articles as the held-out test set. Each split is one token stream (articles in title order, each followed by EOS)
cut into non-overlapping windows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from rankwise.data.wiki import articles
from rankwise.data.windows import cut_windows
from rankwise.errors import InvalidInputError


@dataclass(frozen=True)
class TopicWindows:
    """Token windows [W, T] of one topic's train / validation / test articles."""

    topic: str
    train: torch.Tensor
    validation: torch.Tensor
    test: torch.Tensor

    def vocabulary(self, extra: tuple[int, ...] = ()) -> torch.Tensor:
        """Sorted token ids occurring in any window (plus `extra`), the output vocabulary of the task. -> [V]"""
        ids = torch.cat([self.train.flatten(), self.validation.flatten(), self.test.flatten(), torch.tensor(extra, dtype=torch.long)])
        return torch.unique(ids)


def topic_stream(tokenizer: PreTrainedTokenizerBase, split: str, topic: str) -> torch.Tensor:
    """The topic's articles of `split` as one token stream (title order, EOS after each). -> [N] int64"""
    texts = [a.text for a in articles(split) if a.topic == topic]
    if not texts:
        raise InvalidInputError(f"no articles of topic {topic!r} in split {split!r}")
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return torch.tensor([t for seq in ids for t in (*seq, eos)], dtype=torch.long)


def topic_windows(tokenizer: PreTrainedTokenizerBase, topic: str, seq_len: int, train: int, validation: int, test: int) -> TopicWindows:
    """At most `train` / `validation` / `test` windows of the topic's train / calibration / eval articles."""
    def cut(split: str, n: int) -> torch.Tensor:
        return cut_windows(topic_stream(tokenizer, split, topic), seq_len, n, f"topic {topic!r} in split {split!r}")

    return TopicWindows(topic, cut("train", train), cut("calibration", validation), cut("eval", test))
