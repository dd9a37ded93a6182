"""GuardSpace's two matrix computations, in float64: the covariance-preconditioned split of a weight against a
protected input set (CorDA's knowledge-preserving split), and the null-space projector of the protected inputs.

Layout is PyTorch's: `h = W x`, W [out, in]; C [in, in] is the uncentred second moment of the protected inputs
(`SecondMoment.covariance()`, i.e. X X^T / N). Both functions share one eigendecomposition C = Q diag(lambda) Q^T
(`rankwise.core.linalg.symmetric_eigh`); the diagonal loading below is `core.linalg.damped_spectrum` on it.

Split. With C_delta = C + delta * mean(diag C) * I and SVD(W C_delta) = U S V^T (S descending),
    W = U S (V^T C_delta^{-1})        exactly, for any delta > 0.
Components with large S act strongly on protected inputs and stay frozen; the adapter gets the r smallest:
    M_r = U[:, -r:] S[-r:] (V^T C_delta^{-1})[-r:]          (so M_r C_delta = U_r S_r V_r^T).
Because C is rank-deficient (fewer protected tokens than dimensions), delta is needed, and the rows of
V^T C_delta^{-1} along C's null space have norm ~1/delta. The card's factorisation B = U sqrt(S), A = sqrt(S) V^T C^-1
then makes A ~1/sqrt(delta) and B ~sqrt(delta), a badly scaled starting point for Adam; `balanced=True` rescales each
component so its column of B and row of A have equal norms (the product, hence every invariant, is unchanged).

Projector. Eigenvectors of C with lambda <= tau * lambda_max span the protected null space: P = Qhat Qhat^T. With
tau at rounding level P X = 0 exactly (the card's Lemma); a larger tau also covers directions the protected inputs
barely use, which is what lets the protection generalise to similar unseen inputs (the guarantee is then approximate).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.core.linalg import damped_spectrum
from rankwise.errors import InvalidInputError, NumericalError

RECONSTRUCTION_TOL = 1e-8  # relative ||W_hat - W|| / ||W|| (float64) that counts as "stable" diagonal loading
MAX_DAMPING = 1e-1


@dataclass(frozen=True)
class GuardedSplit:
    """The r smallest preconditioned components of W as factors, float64: B0 [out, r] @ A0 [r, in] = M_r.

    `singular_values` [k] are all of SVD(W C_delta) (descending); `damping` is the relative loading that was used;
    `reconstruction_error` is ||U S V^T C_delta^{-1} - W|| / ||W||.
    """

    A0: torch.Tensor
    B0: torch.Tensor
    singular_values: torch.Tensor
    damping: float
    reconstruction_error: float


def guarded_split(
    weight: torch.Tensor, eig: tuple[torch.Tensor, torch.Tensor], r: int, damping: float = 1e-6, balanced: bool = True
) -> GuardedSplit:
    """Split W [out, in] against the protected covariance given by `eig` (from `core.linalg.symmetric_eigh`).

    Adaptive diagonal loading: start at `damping` (relative to mean(diag C)) and multiply by 10 until the split
    reconstructs W to RECONSTRUCTION_TOL; NumericalError past MAX_DAMPING.
    """
    values, vectors = eig
    w = weight.detach().double()
    k = min(w.shape)
    if not 1 <= r <= k:
        raise InvalidInputError(f"GuardSpace rank r={r} must be in [1, {k}] for a {tuple(w.shape)} weight")
    if w.size(1) != values.numel():
        raise InvalidInputError(f"weight has {w.size(1)} inputs but the protected covariance is {values.numel()}-dimensional")
    wq = w @ vectors  # W Q [out, in]
    delta = damping
    while True:
        loaded = damped_spectrum(values, delta)  # eigenvalues of C_delta
        # W C_delta = (W Q) diag(loaded) Q^T; its SVD, and V^T C_delta^{-1} = (V^T Q) diag(1/loaded) Q^T.
        u, s, vh = torch.linalg.svd((wq * loaded) @ vectors.T, full_matrices=False)
        vh_cinv = ((vh @ vectors) / loaded) @ vectors.T  # [k, in]
        error = float(torch.linalg.norm((u * s) @ vh_cinv - w) / torch.linalg.norm(w).clamp_min(1e-300))
        if error <= RECONSTRUCTION_TOL:
            break
        delta *= 10
        if delta > MAX_DAMPING:
            raise NumericalError(
                f"the covariance-preconditioned split does not reconstruct the weight (error {error:.2e}) even with "
                f"damping {MAX_DAMPING}; the protected statistics are degenerate — collect more protected tokens"
            )
    u_r, s_r, rows = u[:, -r:], s[-r:], vh_cinv[-r:]
    if balanced:
        # equal norms per component: ||B0[:, i]|| = ||A0[i]|| = sqrt(s_i * ||row_i||)
        norms = rows.norm(dim=1).clamp_min(1e-300)
        B0 = u_r * (s_r * norms).sqrt()
        A0 = rows * (s_r / norms).sqrt()[:, None]
    else:  # the card's literal factorisation
        B0 = u_r * s_r.sqrt()
        A0 = rows * s_r.sqrt()[:, None]
    return GuardedSplit(A0=A0, B0=B0, singular_values=s, damping=delta, reconstruction_error=error)


def null_space_basis(eig: tuple[torch.Tensor, torch.Tensor], threshold: float) -> torch.Tensor:
    """Orthonormal rows Qhat [k, in] spanning the eigenvectors with lambda <= threshold * lambda_max (float64).

    P = Qhat^T Qhat is then symmetric and idempotent. k may be 0 (the protected inputs span everything).
    """
    if threshold < 0:
        raise InvalidInputError(f"null_threshold must be >= 0, got {threshold}")
    values, vectors = eig
    # Eigenvalues of an exactly singular C come out at rounding level (|lambda| ~ 1e-16 lambda_max, either sign);
    # a floor of 1e-12 keeps those in the null space even when threshold = 0.
    cut = max(threshold, 1e-12) * float(values[-1])
    return vectors[:, values <= cut].T.contiguous()
