"""Batched one-dimensional k-means: every row of `values [R, n]` gets its own k centroids (k-means++ initialisation,
then Lloyd iterations), all rows at once.

In one dimension the nearest-centroid regions are intervals. With each row's values sorted once and their prefix
sums kept (float64), a Lloyd step only needs the k - 1 cluster boundaries, the midpoints between sorted centroids
found by binary search among the sorted values, and each cluster's mean is a difference of two prefix sums: an
iteration costs O(R k log n), not O(R n k) (SmolLM2's 70M clustered weights: about 20x faster than assigning every
value each step). Centroids stay sorted, so codes are ordered like the values; `assign` gives the final codes (a
value on a midpoint goes to the lower centroid, the same rule in both).
"""

from __future__ import annotations

import torch

from rankwise.errors import InvalidInputError, NumericalError


def assign(values: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Nearest-centroid codes int64 [R, n] of `values [R, n]` under sorted `centroids [R, k]`."""
    mid = 0.5 * (centroids[:, 1:] + centroids[:, :-1])
    return torch.searchsorted(mid.contiguous(), values.contiguous())


def cluster_means(values: torch.Tensor, codes: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row cluster sums' means [R, k] and counts [R, k] (a cluster with no member has mean 0, count 0)."""
    sums = values.new_zeros(values.shape[0], k).scatter_add_(1, codes, values)
    counts = values.new_zeros(values.shape[0], k).scatter_add_(1, codes, torch.ones_like(values))
    return sums / counts.clamp_min(1), counts


def _plus_plus(values: torch.Tensor, k: int, g: torch.Generator) -> torch.Tensor:
    r, n = values.shape
    rows = torch.arange(r)
    first = torch.randint(0, n, (r,), generator=g)
    chosen = [values[rows, first]]
    d2 = (values - chosen[0][:, None]) ** 2
    for _ in range(1, k):
        cdf = d2.double().cumsum(1)
        flat = cdf[:, -1] <= 0  # every value already a centroid: any pick
        cdf[flat] = torch.arange(1, n + 1, dtype=cdf.dtype)
        # a draw proportional to D^2 by inverse CDF (torch.multinomial row by row was 60% of the clustering time)
        u = torch.rand(r, 1, generator=g, dtype=cdf.dtype) * cdf[:, -1:]
        pick = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_max(n - 1)
        c = values[rows, pick]
        chosen.append(c)
        d2 = torch.minimum(d2, (values - c[:, None]) ** 2)
    return torch.stack(chosen, 1).sort(1).values


def kmeans_rows(values: torch.Tensor, k: int = 16, iters: int = 300, tol: float = 1e-6, seed: int = 42
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """k-means of each row of `values [R, n]` -> (centroids [R, k] sorted ascending, codes uint8 [R, n]).

    Stops when no centroid moves by more than `tol` times the row's value range, or after `iters` Lloyd steps. An
    emptied cluster keeps its previous centroid. Computed in the input's dtype (fp32 for weights).
    """
    if values.dim() != 2 or values.numel() == 0:
        raise InvalidInputError(f"k-means needs a non-empty [R, n] tensor, got shape {tuple(values.shape)}")
    if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= 256:
        raise InvalidInputError(f"the number of centroids must be an integer in [2, 256], got {k!r}")
    if not torch.isfinite(values).all():
        raise NumericalError("k-means input contains NaN or infinity")
    g = torch.Generator().manual_seed(seed)
    centroids = _plus_plus(values, k, g)
    span = (values.amax(1) - values.amin(1)).clamp_min(torch.finfo(values.dtype).tiny)[:, None]
    ordered = values.sort(1).values.contiguous()
    prefix = torch.nn.functional.pad(ordered.double().cumsum(1), (1, 0))  # [R, n + 1], prefix[:, j] = sum of j smallest
    n = values.shape[1]
    for _ in range(iters):
        mid = (0.5 * (centroids[:, 1:] + centroids[:, :-1])).contiguous()
        cut = torch.searchsorted(ordered, mid, right=True)  # values <= a midpoint belong to the lower centroid
        bounds = torch.cat([torch.zeros_like(cut[:, :1]), cut, torch.full_like(cut[:, :1], n)], 1)  # [R, k + 1]
        counts = bounds[:, 1:] - bounds[:, :-1]
        sums = prefix.gather(1, bounds[:, 1:]) - prefix.gather(1, bounds[:, :-1])
        means = (sums / counts.clamp_min(1)).to(values.dtype)
        new = torch.where(counts > 0, means, centroids).sort(1).values
        moved = float(((new - centroids).abs() / span).max())
        centroids = new
        if moved <= tol:
            break
    return centroids, assign(values, centroids).to(torch.uint8)
