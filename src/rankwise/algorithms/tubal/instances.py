"""Synthetic symmetric PSD low-tubal-rank tensors X* = X * X^T (the card's simulation set-up)."""

from __future__ import annotations

import torch

from rankwise.algorithms.tubal.tproduct import t_product, t_transpose
from rankwise.algorithms.tubal.tsvd import t_spectral_norm
from rankwise.errors import InvalidInputError


def low_tubal_rank_psd(n: int, rank: int, k: int, *, seed: int = 0, normalize: bool = True) -> torch.Tensor:
    """X* = X * X^T [n, n, k] with X [n, r, k] i.i.d. N(0, 1) (float64): t-symmetric, every Fourier slice Hermitian
    PSD, tubal rank r (almost surely). With `normalize`, scaled to spectral norm ||X*|| = 1."""
    for name, v in (("n", n), ("rank", rank), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidInputError(f"{name} must be a positive integer, got {v!r}")
    if rank > n:
        raise InvalidInputError(f"rank r={rank} cannot exceed n={n}")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, rank, k, generator=gen, dtype=torch.float64)
    star = t_product(x, t_transpose(x))
    star = (star + t_transpose(star)) / 2  # exact t-symmetry (the FFT leaves rounding-level asymmetry)
    return star / t_spectral_norm(star) if normalize else star
