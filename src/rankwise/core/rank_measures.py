"""Measures of how many directions a matrix really uses, from its singular values, and the singular values of a
product given in factored form (a LoRA delta B A) without forming it.

- effective rank (Roy & Vetterli, 2007): exp of the Shannon entropy of the singular values normalised to sum 1;
  equals k for k equal singular values and falls towards 1 as one direction dominates;
- stable rank: ||M||_F^2 / ||M||_2^2, the energy in units of the largest direction;
- top-1 energy share: sigma_1^2 / sum sigma^2.
All take singular values in any order and return Python floats; a zero matrix has effective and stable rank 0.
"""

from __future__ import annotations

import torch


def _nonnegative(sigma: torch.Tensor) -> torch.Tensor:
    s = sigma.detach().to(torch.float64).flatten()
    if bool((s < 0).any()) or not bool(torch.isfinite(s).all()):
        raise ValueError("singular values must be finite and non-negative")
    return s


def effective_rank(sigma: torch.Tensor) -> float:
    """exp(H(p)) with p = sigma / sum(sigma) (0 log 0 = 0)."""
    s = _nonnegative(sigma)
    total = s.sum()
    if total <= 0:
        return 0.0
    p = s[s > 0] / total
    return float(torch.exp(-(p * p.log()).sum()))


def stable_rank(sigma: torch.Tensor) -> float:
    s = _nonnegative(sigma)
    top = s.max() if s.numel() else torch.tensor(0.0, dtype=torch.float64)
    return 0.0 if top <= 0 else float((s * s).sum() / (top * top))


def top_energy_share(sigma: torch.Tensor) -> float:
    s = _nonnegative(sigma)
    energy = (s * s).sum()
    return 0.0 if energy <= 0 else float(s.max() ** 2 / energy)


def factored_singular_values(B: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """The singular values of B @ A, B [m, r], A [r, n], in float64, descending, length min(r, m, n).

    Through two thin QRs (B = Q_B R_B, A^T = Q_A R_A, so B A = Q_B (R_B R_A^T) Q_A^T): the cost is O((m + n) r^2)
    rather than the O(m n r) of forming the product, and the small core's SVD carries all of the spectrum.
    """
    if B.dim() != 2 or A.dim() != 2 or B.shape[1] != A.shape[0]:
        raise ValueError(f"need B [m, r] and A [r, n], got {tuple(B.shape)} and {tuple(A.shape)}")
    _, r_b = torch.linalg.qr(B.detach().to(torch.float64))
    _, r_a = torch.linalg.qr(A.detach().to(torch.float64).T)
    return torch.linalg.svdvals(r_b @ r_a.T)


def participation_ratio(sigma: torch.Tensor) -> float:
    """(sum sigma)^2 / sum sigma^2: between 1 (one direction) and k (k equal singular values). PALC's "effective
    dimension" of its calibration map; unlike `effective_rank` it weighs directions by their share of the
    singular-value sum squared rather than by entropy."""
    s = _nonnegative(sigma)
    energy = (s * s).sum()
    return 0.0 if energy <= 0 else float(s.sum() ** 2 / energy)
