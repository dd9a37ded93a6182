"""Multi-query associative recall (MQAR), generated: N key-value pairs, then every key asked once.

A sequence of length 3N: k_1 v_1 k_2 v_2 ... k_N v_N, then the N keys again in a random order. At a query position
the target is the value that followed that key in the context; every other position has no target (-100). Keys are
distinct tokens of [1, key_vocab]; values are drawn with replacement from the next `value_vocab` tokens.
"""

from __future__ import annotations

import torch

IGNORE = -100


def mqar_batch(n_pairs: int, batch: int, gen: torch.Generator, key_vocab: int = 127,
               value_vocab: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [batch, 3 n_pairs] int64, targets [batch, 3 n_pairs] int64 with IGNORE off the query positions)."""
    if n_pairs > key_vocab:
        raise ValueError(f"{n_pairs} pairs need {n_pairs} distinct keys, only {key_vocab} exist")
    keys = torch.rand(batch, key_vocab, generator=gen).argsort(-1)[:, :n_pairs] + 1  # distinct keys per row
    values = torch.randint(key_vocab + 1, key_vocab + 1 + value_vocab, (batch, n_pairs), generator=gen)
    order = torch.rand(batch, n_pairs, generator=gen).argsort(-1)  # the query order
    context = torch.stack([keys, values], dim=-1).flatten(1)  # [B, 2N]
    tokens = torch.cat([context, keys.gather(1, order)], dim=1)
    targets = torch.full_like(tokens, IGNORE)
    targets[:, 2 * n_pairs:] = values.gather(1, order)
    return tokens, targets


def vocab_size(key_vocab: int = 127, value_vocab: int = 128) -> int:
    return 1 + key_vocab + value_vocab  # token 0 is unused (reserved)


__all__ = ["IGNORE", "mqar_batch", "vocab_size"]
