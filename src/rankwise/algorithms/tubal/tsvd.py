"""The t-SVD, tubal rank and t-norms, from the SVDs of the Fourier slices.

For a real A, slice i and slice k - i of Â are complex conjugates (i = 1..k-1), and slices 0 and k/2 (k even) are
real. Decomposing slices 0..floor(k/2) and conjugating the rest keeps every factor real after the inverse FFT;
the self-conjugate slices are decomposed as real matrices for the same reason.
"""

from __future__ import annotations

import torch

from rankwise.algorithms.tubal.tproduct import check_tensor, from_fourier, to_fourier
from rankwise.errors import InvalidInputError

EPS64 = torch.finfo(torch.float64).eps


def _self_conjugate(i: int, k: int) -> bool:
    return i == 0 or 2 * i == k


def conjugate_symmetric_apply(a_hat: torch.Tensor, per_slice) -> list[torch.Tensor]:
    """Apply `per_slice(matrix) -> tuple of tensors` to slices 0..floor(k/2) of Â [..., n1, n2, k] (real matrices
    for self-conjugate slices) and fill slices k - i with the conjugates; returns each output stacked on a last
    dimension of length k (complex)."""
    k = a_hat.shape[-1]
    outputs: list[list[torch.Tensor | None]] = []
    for i in range(k // 2 + 1):
        m = a_hat[..., i]
        res = per_slice(m.real if _self_conjugate(i, k) else m)
        if not outputs:
            outputs = [[None] * k for _ in res]
        for o, r in zip(outputs, res):
            o[i] = r.to(torch.complex128) if not r.is_complex() else r
            if not _self_conjugate(i, k):
                o[k - i] = o[i].conj()
    return [torch.stack(o, dim=-1) for o in outputs]  # type: ignore[arg-type]


def t_svd(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A = U * S * V^T for A [n1, n2, k] (economy form, p = min(n1, n2)).

    Returns U [n1, p, k] and V [n2, p, k] (t-orthonormal columns: U^T * U = I) and S [p, p, k] f-diagonal
    (every frontal slice diagonal), singular tubes in decreasing order of their Fourier values.
    """
    check_tensor(a, "A", batched=False)
    a = a.to(torch.float64)

    def svd(m):
        u, s, vh = torch.linalg.svd(m, full_matrices=False)
        return u, torch.diag_embed(s.to(m.dtype)), vh.mH

    u_hat, s_hat, v_hat = conjugate_symmetric_apply(to_fourier(a), svd)
    return from_fourier(u_hat), from_fourier(s_hat), from_fourier(v_hat)


def fourier_singular_values(a: torch.Tensor) -> torch.Tensor:
    """Singular values of every Fourier slice of A [..., n1, n2, k]: [..., min(n1, n2), k], each column decreasing."""
    check_tensor(a, "A")
    return torch.linalg.svdvals(to_fourier(a.to(torch.float64)).movedim(-1, -3)).movedim(-2, -1)


def tubal_rank(a: torch.Tensor, tol: float | None = None) -> int:
    """max_i rank(Â^(i)): Fourier singular values above `tol` (default max(n1, n2) k eps sigma_max, float64)."""
    check_tensor(a, "A", batched=False)
    s = fourier_singular_values(a)
    if tol is None:
        tol = max(a.shape[0], a.shape[1]) * a.shape[2] * EPS64 * float(s.max())
    if tol < 0:
        raise InvalidInputError(f"tol must be >= 0, got {tol}")
    return int((s > tol).sum(0).max())


def t_spectral_norm(a: torch.Tensor) -> float:
    """||A|| = max_i sigma_max(Â^(i)) = ||bcirc(A)||_2."""
    return float(fourier_singular_values(a).max())


def t_frobenius_norm(a: torch.Tensor) -> float:
    """||A||_F = sqrt(sum of squared entries) = sqrt((1/k) sum_i ||Â^(i)||_F^2) (Parseval)."""
    check_tensor(a, "A")
    return float(a.to(torch.float64).pow(2).sum().sqrt())


def t_condition_number(a: torch.Tensor, tol: float | None = None) -> float:
    """sigma_max / sigma_min over the nonzero Fourier-slice singular values."""
    s = fourier_singular_values(a).flatten()
    if tol is None:
        tol = max(a.shape[-3], a.shape[-2]) * a.shape[-1] * EPS64 * float(s.max())
    nz = s[s > tol]
    if nz.numel() == 0:
        raise InvalidInputError("the tensor is zero: no condition number")
    return float(nz.max() / nz.min())
