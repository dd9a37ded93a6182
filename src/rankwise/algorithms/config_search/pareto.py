"""Pareto fronts of (bits, loss) pairs, both minimised, and CoA-LoRA's segmented Pareto filter.

A point p dominates q when p is no worse in both objectives and better in at least one. `segmented_pareto` bins the
points by their first objective (average bits per weight) into windows of `width` over [low, high] and keeps, in
each window, the points no other point *of that window* dominates; their union is the next training set of
configurations. Per-window fronts keep configurations across the whole range of budgets: a global front would drop
a cheap configuration whenever a slightly costlier one has a much lower loss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rankwise.errors import InvalidInputError


def _as_points(bits: Sequence[float], losses: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    b, l = np.asarray(bits, dtype=np.float64), np.asarray(losses, dtype=np.float64)
    if b.ndim != 1 or b.shape != l.shape:
        raise InvalidInputError(f"bits and losses must be 1-d of one length, got shapes {b.shape} and {l.shape}")
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(l))):
        raise InvalidInputError("bits and losses must be finite (a diverged evaluation cannot be ranked)")
    return b, l


def nondominated(bits: Sequence[float], losses: Sequence[float]) -> list[int]:
    """Indices (ascending) of the points not dominated by any other point (both objectives minimised).

    Duplicated points do not dominate each other, so all copies are kept."""
    b, l = _as_points(bits, losses)
    order = np.lexsort((l, b))  # by bits, then loss
    keep, best = [], math.inf
    i = 0
    while i < len(order):
        j = i  # a run of equal bits: only its smallest loss can survive, and only if below every cheaper point's
        while j < len(order) and b[order[j]] == b[order[i]]:
            j += 1
        run_best = l[order[i]]
        if run_best < best:
            keep.extend(int(k) for k in order[i:j] if l[k] == run_best)
            best = run_best
        i = j
    return sorted(keep)


def segmented_pareto(bits: Sequence[float], losses: Sequence[float], low: float = 2.25, high: float = 6.5,
                     width: float = 0.25) -> list[int]:
    """Indices (ascending) of the per-window non-dominated points; windows [low + k w, low + (k+1) w), the last one
    closed at `high`; points outside [low, high] are dropped."""
    if not (math.isfinite(low) and math.isfinite(high) and low < high and width > 0):
        raise InvalidInputError(f"need finite low < high and width > 0, got low={low}, high={high}, width={width}")
    b, l = _as_points(bits, losses)
    n_bins = max(1, math.ceil((high - low) / width - 1e-9))
    inside = np.flatnonzero((b >= low) & (b <= high))
    bins = np.minimum(((b[inside] - low) / width).astype(int), n_bins - 1)
    keep: list[int] = []
    for k in np.unique(bins):
        members = inside[bins == k]
        keep.extend(int(members[i]) for i in nondominated(b[members], l[members]))
    return sorted(keep)


def hypervolume_2d(costs: Sequence[float], values: Sequence[float], ref_cost: float, ref_value: float) -> float:
    """Area dominated by points (cost minimised, value maximised) and bounded by (ref_cost, ref_value): the
    hypervolume of an accuracy-vs-bits front with reference (max bits, 0 accuracy). Points outside are ignored."""
    c, v = _as_points(costs, values)
    mask = (c <= ref_cost) & (v >= ref_value)
    pts = sorted(zip(c[mask], v[mask]))
    area, best = 0.0, ref_value
    for i, (ci, vi) in enumerate(pts):
        best = max(best, vi)
        nxt = pts[i + 1][0] if i + 1 < len(pts) else ref_cost
        area += (nxt - ci) * (best - ref_value)
    return float(area)
