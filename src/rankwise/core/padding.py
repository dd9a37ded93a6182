"""Right-padding variable-length sequences into one batch tensor."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rankwise.errors import InvalidInputError


def pad_batch(seqs: Sequence[torch.Tensor], value: float | int) -> torch.Tensor:
    """Right-pad [T_i, ...] tensors (same trailing shape and dtype) with `value` to [B, T_max, ...].

    Causal models never look right, so padded ids or hidden states need no mask there; encoders need one
    (pad `torch.ones(T_i)` with 0).
    """
    if not seqs:
        raise InvalidInputError("pad_batch needs at least one sequence")
    width = max(s.size(0) for s in seqs)
    out = torch.full((len(seqs), width, *seqs[0].shape[1:]), value, dtype=seqs[0].dtype)
    for i, s in enumerate(seqs):
        out[i, : s.size(0)] = s
    return out
