"""Fixed-length, non-overlapping token windows over a corpus split, for language modelling and calibration."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from rankwise.data.wiki import articles
from rankwise.errors import InvalidInputError

_token_cache: dict[tuple[str, int, str], torch.Tensor] = {}


def split_tokens(tokenizer: PreTrainedTokenizerBase, split: str) -> torch.Tensor:
    """The whole split as one token stream: articles in title order, each followed by the EOS token. -> [N] int64"""
    key = (tokenizer.name_or_path, len(tokenizer), split)
    if key not in _token_cache:
        texts = [a.text for a in articles(split)]
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        stream = [t for seq in ids for t in (*seq, eos)]
        _token_cache[key] = torch.tensor(stream, dtype=torch.long)
    return _token_cache[key]


def token_windows(
    tokenizer: PreTrainedTokenizerBase, split: str, seq_len: int, max_windows: int | None = None
) -> torch.Tensor:
    """Non-overlapping windows of `seq_len` tokens cut from the split's stream (the tail is dropped). -> [W, seq_len]

    `max_windows` keeps the first W windows, so a smaller evaluation is a prefix of a larger one.
    """
    if seq_len < 2:  # checked before tokenizing the split
        raise InvalidInputError(f"seq_len must be at least 2 (one input and one target), got {seq_len}")
    return cut_windows(split_tokens(tokenizer, split), seq_len, max_windows, source=f"split {split!r}")


def cut_windows(stream: torch.Tensor, seq_len: int, max_windows: int | None = None, source: str = "the text") -> torch.Tensor:
    """Non-overlapping windows [W, seq_len] from the start of a token stream [N] (the tail is dropped); `source`
    names the stream in errors."""
    if seq_len < 2:
        raise InvalidInputError(f"seq_len must be at least 2 (one input and one target), got {seq_len}")
    n = stream.numel() // seq_len
    if max_windows is not None:
        if max_windows < 1:
            raise InvalidInputError(f"max_windows must be positive, got {max_windows}")
        n = min(n, max_windows)
    if n == 0:
        raise InvalidInputError(f"{source} has {stream.numel()} tokens, fewer than one window of {seq_len}")
    return stream[: n * seq_len].view(n, seq_len).clone()
