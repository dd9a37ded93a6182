"""The explained-variance rank rule WASI uses for weights (at t = 0) and activations (per Tucker mode).

Given the energies e_1 >= e_2 >= ... (squared singular values, or the eigenvalues of a Gram matrix), the rank at
threshold eps is the smallest K with sum_{j<=K} e_j / sum_j e_j >= eps -- the authors' `searchsorted(cumvar, eps) + 1`
(`SVD_var` in `linear_WASI.py`), computed here in float64 and clamped to the number of energies, so that eps = 1.0
keeps every direction even when the cumulative sum stops a rounding error short of 1.
"""

from __future__ import annotations

import math

import torch

from rankwise.errors import InvalidInputError


def check_epsilon(epsilon: float, what: str = "epsilon") -> float:
    """`epsilon` as a float in (0, 1], or an InvalidInputError naming `what`."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not math.isfinite(float(epsilon)):
        raise InvalidInputError(f"{what} must be a number in (0, 1], got {epsilon!r}")
    if not 0.0 < float(epsilon) <= 1.0:
        raise InvalidInputError(f"{what} is an explained-variance threshold: it must lie in (0, 1], got {epsilon}")
    return float(epsilon)


def explained_variance_rank(energies: torch.Tensor, epsilon: float) -> int:
    """The smallest K with cumsum(energies)[K-1] / sum(energies) >= epsilon; energies [n] sorted descending, >= 0.

    An all-zero spectrum (a zero weight or activation) has no direction to keep: K = 1, the smallest valid rank."""
    epsilon = check_epsilon(epsilon)
    e = energies.detach().double().clamp_min(0.0).flatten()
    if e.numel() == 0:
        raise InvalidInputError("an explained-variance rank needs at least one energy")
    total = float(e.sum())
    if total <= 0.0:
        return 1
    cumulative = torch.cumsum(e, 0) / total
    # Relative slack of a few ulps: a spectrum whose cumulative share reaches eps only up to float64 rounding counts.
    k = int((cumulative < epsilon - 4 * torch.finfo(torch.float64).eps).sum()) + 1
    return min(k, e.numel())


def spectrum_of(matrix: torch.Tensor) -> torch.Tensor:
    """Squared singular values of a matrix [m, n] (float64, descending): what the weight rank rule reads."""
    return torch.linalg.svdvals(matrix.detach().double()).square()
