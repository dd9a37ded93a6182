"""Deterministic stratified splits shared by the domain loaders (tabular by label x group, graphs by label,
images by class): a pure function of the strata, the fractions and a seed."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from rankwise.errors import InvalidInputError


def stratified_split(strata: torch.Tensor, fractions: Sequence[float] = (0.8, 0.1, 0.1),
                     seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Split rows 0..N-1 into len(fractions) disjoint parts covering all rows, stratum by stratum.

    strata [N] int64: a stratum id per row. Within each stratum the rows are permuted by a generator seeded with
    `seed` (strata in ascending order), and part k gets round(n_s * fractions[k]) of them, by largest remainder, so
    that each part's count in each stratum is within 1 of its exact share. A pure function of (strata, fractions,
    seed). -> one sorted int64 index tensor per part
    """
    fractions = tuple(float(f) for f in fractions)
    if len(fractions) < 2 or any(not math.isfinite(f) or f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise InvalidInputError(f"fractions must be >= 2 positive numbers summing to 1, got {fractions}")
    if strata.dim() != 1 or strata.dtype.is_floating_point:
        raise InvalidInputError(f"strata must be a 1-D integer tensor, got {tuple(strata.shape)} {strata.dtype}")
    generator = torch.Generator().manual_seed(int(seed))
    parts: list[list[torch.Tensor]] = [[] for _ in fractions]
    for value in torch.unique(strata).tolist():  # ascending: the generator's draws follow a fixed order
        rows = torch.nonzero(strata == value).flatten()
        rows = rows[torch.randperm(rows.numel(), generator=generator)]
        start = 0
        for k, count in enumerate(largest_remainder(rows.numel(), fractions)):
            parts[k].append(rows[start:start + count])
            start += count
    return tuple(torch.cat(p).sort().values if p else torch.zeros(0, dtype=torch.long) for p in parts)


def largest_remainder(n: int, fractions: Sequence[float]) -> list[int]:
    """n split into integer counts proportional to `fractions` (summing to 1), each within 1 of its exact share
    (floors, then one more to the largest remainders; ties to the earlier part)."""
    exact = [n * f for f in fractions]
    counts = [math.floor(e) for e in exact]
    by_remainder = sorted(range(len(fractions)), key=lambda k: (-(exact[k] - counts[k]), k))
    for k in by_remainder[: n - sum(counts)]:
        counts[k] += 1
    return counts
