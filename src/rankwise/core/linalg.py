"""Generic float64 linear algebra for covariance-aware low-rank methods (CARE, SVD-LLM, GuardSpace, PiCa, ...).

Conventions: a weight `W` is [out, in], as torch stores it (`nn.Linear.weight`), and acts as `X @ W^T` on rows `X`
[T, in]. A *whitener* `S` is an [in, in] matrix with `S^T S = C` for an input second moment `C`, so that
`||X W^T||_F^2 / T = ||W S^T||_F^2` (the trace identity). Minimising `||(W - W_hat) S^T||_F` over rank-r `W_hat`
therefore minimises the activation error, and Eckart-Young solves it by an SVD of `W S^T`. Low-rank factors are the
two torch weights of `down` then `up`: `W_hat = up @ down`, down [r, in], up [out, r].

Everything is float64: covariances are ill-conditioned (massive activations, fewer tokens than dimensions), and the
square root of an ill-conditioned matrix loses half the digits. We never form an explicit inverse; undoing a
whitener is a linear solve (triangular where the whitener is triangular).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.errors import InvalidInputError, NumericalError

EIGEN_FLOOR = 1e-8  # relative to the largest eigenvalue: below this a direction is treated as numerically absent


def _check_square_symmetric(c: torch.Tensor, name: str = "matrix") -> torch.Tensor:
    if c.dim() != 2 or c.size(0) != c.size(1):
        raise InvalidInputError(f"{name} must be square [d, d], got shape {tuple(c.shape)}")
    if not torch.isfinite(c).all():
        raise NumericalError(f"{name} contains NaN or Inf; check the data it was computed from")
    c = c.double()
    return (c + c.T) / 2  # accumulated sums are symmetric only up to rounding


def damp(c: torch.Tensor, relative: float) -> torch.Tensor:
    """`C + relative * mean(diag C) * I` (float64 [d, d]); relative damping is independent of the data's scale."""
    if relative < 0:
        raise InvalidInputError(f"damping must be >= 0, got {relative}")
    c = _check_square_symmetric(c, "covariance")
    return c + relative * c.diagonal().mean() * torch.eye(c.size(0), dtype=c.dtype)


def damped_spectrum(values: torch.Tensor, relative: float) -> torch.Tensor:
    """The eigenvalues of `damp(C, relative)` from C's eigenvalues [d] (same eigenvectors), so one `symmetric_eigh`
    serves every damping. Rounding-level negative eigenvalues count as 0, and mean(diag C) is taken as their mean
    (the trace is invariant), so it agrees with `damp` up to rounding."""
    if relative < 0:
        raise InvalidInputError(f"damping must be >= 0, got {relative}")
    psd = values.double().clamp_min(0)
    return psd + relative * float(psd.mean())


def symmetric_eigh(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigen-decomposition of a symmetric PSD matrix (symmetrised, float64), eigenvalues as they come.

    Returns (eigenvalues [d] ascending, eigenvectors [d, d] as columns). Rounding-level eigenvalues of a singular C
    stay near 0 (either sign), so its null space is still visible (GuardSpace's projector needs it). Raises
    NumericalError for a zero matrix.
    """
    c = _check_square_symmetric(c, "covariance")
    values, vectors = torch.linalg.eigh(c)
    if values[-1] <= 0:
        raise NumericalError("the covariance is zero (all activations were zero?); calibrate on real data")
    return values, vectors


def clamped_eigh(c: torch.Tensor, floor: float = EIGEN_FLOOR) -> tuple[torch.Tensor, torch.Tensor]:
    """`symmetric_eigh` with eigenvalues clamped to >= floor * max eigenvalue (float64).

    Clamping turns rounding-level negative eigenvalues into small positive ones, so square roots and solves stay
    finite.
    """
    values, vectors = symmetric_eigh(c)
    return values.clamp_min(floor * float(values[-1])), vectors


def symmetric_sqrt(c: torch.Tensor, floor: float = EIGEN_FLOOR) -> torch.Tensor:
    """The symmetric PSD square root `sqrt(C) = Q diag(sqrt(lambda)) Q^T` (float64 [d, d]), eigenvalues clamped."""
    values, vectors = clamped_eigh(c, floor)
    return (vectors * values.sqrt()) @ vectors.T


def symmetric_inverse_sqrt(c: torch.Tensor, floor: float = EIGEN_FLOOR) -> torch.Tensor:
    """`C^{-1/2} = Q diag(lambda^{-1/2}) Q^T` (float64 [d, d]), for callers that need the whitening matrix itself."""
    values, vectors = clamped_eigh(c, floor)
    return (vectors * values.rsqrt()) @ vectors.T


@dataclass(frozen=True)
class Whitener:
    """A [d, d] matrix `S` with `S^T S ~= C`, applied as `S @ W` and undone by a solve (never an inverse).

    kind: 'identity' (S = I), 'diagonal' (S = diag(s), stored as the vector s), 'symmetric' (S = sqrt(C)) or
    'cholesky' (S = L^T with C = L L^T, upper triangular).
    """

    kind: str
    matrix: torch.Tensor | None  # [d, d] or [d] for 'diagonal'; None for 'identity'

    def apply(self, w: torch.Tensor) -> torch.Tensor:
        """`S @ W` for W [d, k]."""
        w = w.double()
        if self.kind == "identity":
            return w
        if self.kind == "diagonal":
            return self.matrix[:, None] * w
        return self.matrix @ w

    def solve(self, y: torch.Tensor) -> torch.Tensor:
        """`S^{-1} @ Y` for Y [d, k], by a (triangular, diagonal or general) solve."""
        y = y.double()
        if self.kind == "identity":
            return y
        if self.kind == "diagonal":
            return y / self.matrix[:, None]
        if self.kind == "cholesky":
            return torch.linalg.solve_triangular(self.matrix, y, upper=True)
        return torch.linalg.solve(self.matrix, y)


def identity_whitener() -> Whitener:
    return Whitener("identity", None)


def diagonal_whitener(scale: torch.Tensor) -> Whitener:
    """`S = diag(scale)`; every entry must be positive and finite (e.g. ASVD's per-channel activation scale)."""
    scale = scale.double()
    if scale.dim() != 1 or not torch.isfinite(scale).all() or (scale <= 0).any():
        raise InvalidInputError("a diagonal whitener needs a 1-D vector of positive finite scales")
    return Whitener("diagonal", scale)


def sqrt_whitener(c: torch.Tensor, floor: float = EIGEN_FLOOR) -> Whitener:
    """`S = sqrt(C)` by a float64 eigendecomposition (CARE). Damp C first (see `damp`) if it may be singular."""
    return Whitener("symmetric", symmetric_sqrt(c, floor))


def cholesky_whitener(c: torch.Tensor) -> Whitener:
    """`S = L^T` with `C = L L^T` (SVD-LLM). Raises NumericalError if C is not positive definite: damp it first."""
    c = _check_square_symmetric(c, "covariance")
    lower, info = torch.linalg.cholesky_ex(c)
    if int(info) != 0:
        raise NumericalError("the covariance is not positive definite, so it has no Cholesky factor; increase the damping")
    return Whitener("cholesky", lower.T.contiguous())


@dataclass(frozen=True)
class LowRankFactors:
    """`W_hat = up @ down` with down [r, in] and up [out, r] (torch layout: the weights of two stacked nn.Linear),
    plus the whitened spectrum.

    `singular_values` [min(out, in)] are those of `W S^T` (all of them, not only the kept ones), which is what rank
    allocation and tail-energy errors need.
    """

    down: torch.Tensor
    up: torch.Tensor
    singular_values: torch.Tensor

    @property
    def rank(self) -> int:
        return self.down.size(0)

    def product(self) -> torch.Tensor:
        return self.up @ self.down


def whitened_svd(w: torch.Tensor, whitener: Whitener) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD of `W S^T` in float64 for W [out, in]: (U [out, k], sigma [k] descending, Vh [k, in]), k = min(out, in)."""
    if w.dim() != 2:
        raise InvalidInputError(f"a weight must be 2-D [out, in], got shape {tuple(w.shape)}")
    if not torch.isfinite(w).all():
        raise NumericalError("the weight contains NaN or Inf")
    # The whitener acts on the input side; it is applied (and later undone) on columns, so the SVD is of S W^T.
    u, sigma, vh = torch.linalg.svd(whitener.apply(w.T), full_matrices=False)
    return vh.T, sigma, u.T


def truncate_whitened_svd(u: torch.Tensor, sigma: torch.Tensor, vh: torch.Tensor, whitener: Whitener, rank: int) -> LowRankFactors:
    """Rank-`rank` factors from a whitened SVD (Eckart-Young in the S-norm): up = U_r [out, r], down =
    diag(sigma_r) Vh_r S^{-T} [r, in]."""
    if not 1 <= rank <= sigma.numel():
        raise InvalidInputError(f"rank must be in [1, {sigma.numel()}], got {rank}")
    down = whitener.solve(vh[:rank].T * sigma[:rank]).T
    return LowRankFactors(down=down, up=u[:, :rank].clone(), singular_values=sigma.clone())


def whitened_low_rank(w: torch.Tensor, whitener: Whitener, rank: int) -> LowRankFactors:
    """The rank-`rank` `W_hat` minimising `||(W - W_hat) S^T||_F` (float64 factors). W is [out, in]."""
    u, sigma, vh = whitened_svd(w, whitener)
    return truncate_whitened_svd(u, sigma, vh, whitener, rank)


def weighted_error(delta: torch.Tensor, c: torch.Tensor) -> float:
    """`trace(Delta C Delta^T)` for Delta [out, in] = mean over rows x of ||Delta x||^2 when C [in, in] is the
    (uncentred) second moment. float64."""
    delta = delta.double()
    return float(torch.einsum("ji,ik,jk->", delta, c.double(), delta))


def relative_activation_error(w: torch.Tensor, w_hat: torch.Tensor, c: torch.Tensor) -> float:
    """`||X (W - W_hat)^T||_F / ||X W^T||_F` (W, W_hat [out, in]) from the second moment C of X, by the trace identity."""
    reference = weighted_error(w, c)
    if reference <= 0:
        raise NumericalError("||X W|| is zero: the activations or the weight vanish")
    return (weighted_error(w.double() - w_hat.double(), c) / reference) ** 0.5
