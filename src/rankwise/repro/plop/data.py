"""The generative fine-tuning task of the PLoP reproduction: next-token prediction on the wiki articles of one topic.

Splits follow the corpus's article-level hash splits (`rankwise.data.wiki`): the topic's `train` articles are the
fine-tuning data, its `calibration` articles (unused by this experiment otherwise) are the validation set that picks
each placement's learning rate, and its `eval` articles are the held-out test set. Each split is one token stream
(articles in title order, each followed by EOS) cut into non-overlapping windows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from rankwise.data import articles
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


def windows(stream: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    """The first `max_windows` non-overlapping windows of `seq_len` tokens of a stream [N]. -> [W, seq_len]"""
    if seq_len < 2 or max_windows < 1:
        raise InvalidInputError(f"seq_len must be >= 2 and max_windows >= 1, got {seq_len}, {max_windows}")
    n = min(stream.numel() // seq_len, max_windows)
    if n == 0:
        raise InvalidInputError(f"a stream of {stream.numel()} tokens holds no window of {seq_len}")
    return stream[: n * seq_len].view(n, seq_len).clone()


def topic_windows(tokenizer: PreTrainedTokenizerBase, topic: str, seq_len: int, train: int, validation: int, test: int) -> TopicWindows:
    """At most `train` / `validation` / `test` windows of the topic's train / calibration / eval articles."""
    return TopicWindows(
        topic,
        windows(topic_stream(tokenizer, "train", topic), seq_len, train),
        windows(topic_stream(tokenizer, "calibration", topic), seq_len, validation),
        windows(topic_stream(tokenizer, "eval", topic), seq_len, test),
    )
