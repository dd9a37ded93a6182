"""Initialisations of the factor U [n, R, k] for factorised gradient descent on U * U^T.

- small (the paper's proposal): entries i.i.d. N(0, alpha^2 / R), alpha = 1e-10 in the paper's simulations;
- spectral (the usual baseline): the top-R eigenpairs of every Fourier slice of sym((1/m) M*(y));
- large random (a baseline): the small initialisation with alpha = 10 (and a reduced step).
"""

from __future__ import annotations

import math

import torch

from rankwise.algorithms.tubal.measurements import GaussianMeasurements
from rankwise.algorithms.tubal.tproduct import from_fourier, symmetrize, to_fourier
from rankwise.algorithms.tubal.tsvd import conjugate_symmetric_apply
from rankwise.errors import InvalidInputError, NumericalError


def _check_rank(n: int, rank: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= n:
        raise InvalidInputError(f"the tubal rank R must be an integer in [1, n={n}], got {rank!r}")


def small_init(n: int, rank: int, k: int, alpha: float = 1e-10, *, seed: int = 0) -> torch.Tensor:
    """U0 [n, R, k] with i.i.d. N(0, alpha^2 / R) entries (float64)."""
    _check_rank(n, rank)
    if not (math.isfinite(alpha) and alpha > 0):
        raise InvalidInputError(f"alpha must be a positive finite number, got {alpha!r}")
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, rank, k, generator=gen, dtype=torch.float64) * (alpha / math.sqrt(rank))


def spectral_init(measurements: GaussianMeasurements, y: torch.Tensor, rank: int) -> torch.Tensor:
    """U0 [n, R, k] with Û0^(i) = V_R diag(sqrt(max(lambda, 0))) from the top-R eigenpairs of every Fourier slice
    of Y = sym((1/m) M*(y)) (Hermitian slices, as Y is t-symmetric)."""
    n, n2, k = measurements.shape
    if n != n2:
        raise InvalidInputError(f"symmetric recovery needs square slices, got measurement shape {measurements.shape}")
    _check_rank(n, rank)
    if not isinstance(y, torch.Tensor) or y.shape != (measurements.m,):
        raise InvalidInputError(f"y must be a tensor [m={measurements.m}]")
    if not bool(torch.isfinite(y).all()):
        raise NumericalError("y contains NaN or Inf")
    y_sym = symmetrize(measurements.adjoint(y.to(torch.float64)) / measurements.m)

    def top(m):
        m = (m + m.mH) / 2
        values, vectors = torch.linalg.eigh(m)
        return (vectors[:, -rank:] * values[-rank:].clamp_min(0).sqrt().to(vectors.dtype),)

    (u_hat,) = conjugate_symmetric_apply(to_fourier(y_sym), top)
    return from_fourier(u_hat)
