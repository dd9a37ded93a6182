"""Cross-subject pairing for stage 1 (the authors' `Cosine_pairs.py`, on our own frozen features): each frame of
subject b is paired with the frame of subject a most cosine-similar to it among a's frames of the same expression
label, so that a pair differs in person and style, not in expression (the card's pairing pitfall)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from rankwise.errors import InvalidInputError


def cosine_partners(query: torch.Tensor, query_labels: torch.Tensor, pool: torch.Tensor, pool_labels: torch.Tensor) -> torch.Tensor:
    """query [N, D] with labels [N], pool [M, D] with labels [M] -> index [N] into pool of each query's most
    cosine-similar pool frame with the same label. A label absent from the pool is refused."""
    missing = set(query_labels.tolist()) - set(pool_labels.tolist())
    if missing:
        raise InvalidInputError(f"no reference frame with label(s) {sorted(missing)} to pair with")
    sim = F.normalize(query, dim=1) @ F.normalize(pool, dim=1).T
    sim = sim.masked_fill(query_labels[:, None] != pool_labels[None, :], float("-inf"))
    return sim.argmax(1)


__all__ = ["cosine_partners"]
