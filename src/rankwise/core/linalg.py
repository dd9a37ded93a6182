"""Generic float64 linear algebra for covariance-aware low-rank methods (CARE, SVD-LLM, GuardSpace, PiCa, ...).

Conventions (math layout): a weight `W` is [d_in, d_out] and acts as `X @ W` on rows `X` [T, d_in]; for a torch
`nn.Linear` that is `linear.weight.T`. A *whitener* `S` is a [d, d] matrix with `S^T S = C` for an input second
moment `C`, so that `||X W||_F^2 / T = ||S W||_F^2` (the trace identity). Minimising `||S (W - W_hat)||_F` over
rank-r `W_hat` therefore minimises the activation error, and Eckart-Young solves it by an SVD of `S W`.

Everything is float64: covariances are ill-conditioned (massive activations, fewer tokens than dimensions), and the
square root of an ill-conditioned matrix loses half the digits. We never form an explicit inverse; undoing a
whitener is a linear solve (triangular where the whitener is triangular).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from rankwise.errors import InvalidInputError, NumericalError

EIGEN_FLOOR = 1e-8  # relative to the largest eigenvalue: below this a direction is treated as numerically absent


@contextmanager
def few_threads(n: int = 1) -> Iterator[None]:
    """Run the enclosed torch work with at most `n` intra-op threads, then restore the previous count.

    For the small dense factorizations here (eigh / SVD of a few hundred rows) threading gains little, and on a
    busy machine multithreaded LAPACK spin-waits: we measured eigh of a 576 x 576 float64 matrix at 0.05 s of CPU
    on one thread against 0.2-8 s on two when other processes share the cores. Wrap loops of such calls in this.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, min(n, previous)))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


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


def clamped_eigh(c: torch.Tensor, floor: float = EIGEN_FLOOR) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigen-decomposition of a symmetric PSD matrix with eigenvalues clamped to >= floor * max eigenvalue.

    Returns (eigenvalues [d] ascending, eigenvectors [d, d] as columns), float64. Clamping turns rounding-level
    negative eigenvalues into small positive ones, so square roots and solves stay finite.
    """
    c = _check_square_symmetric(c, "covariance")
    values, vectors = torch.linalg.eigh(c)
    top = values[-1].clamp_min(0.0)
    if top <= 0:
        raise NumericalError("the covariance is zero (all activations were zero?); calibrate on real data")
    return values.clamp_min(floor * float(top)), vectors


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
    """`W_hat = down @ up` with down [d_in, r] and up [r, d_out] (math layout), plus the whitened spectrum.

    `singular_values` [min(d_in, d_out)] are those of `S W` (all of them, not only the kept ones), which is what
    rank allocation and tail-energy errors need.
    """

    down: torch.Tensor
    up: torch.Tensor
    singular_values: torch.Tensor

    @property
    def rank(self) -> int:
        return self.down.size(1)

    def product(self) -> torch.Tensor:
        return self.down @ self.up


def whitened_svd(w: torch.Tensor, whitener: Whitener) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD of `S W` in float64: (U [d_in, k], sigma [k] descending, Vh [k, d_out]), k = min(d_in, d_out)."""
    if w.dim() != 2:
        raise InvalidInputError(f"a weight must be 2-D [d_in, d_out], got shape {tuple(w.shape)}")
    if not torch.isfinite(w).all():
        raise NumericalError("the weight contains NaN or Inf")
    return torch.linalg.svd(whitener.apply(w), full_matrices=False)


def truncate_whitened_svd(u: torch.Tensor, sigma: torch.Tensor, vh: torch.Tensor, whitener: Whitener, rank: int) -> LowRankFactors:
    """Rank-`rank` factors from a whitened SVD: down = S^{-1} U_r diag(sigma_r), up = Vh_r (Eckart-Young in the S-norm)."""
    if not 1 <= rank <= sigma.numel():
        raise InvalidInputError(f"rank must be in [1, {sigma.numel()}], got {rank}")
    down = whitener.solve(u[:, :rank] * sigma[:rank])
    return LowRankFactors(down=down, up=vh[:rank].clone(), singular_values=sigma.clone())


def whitened_low_rank(w: torch.Tensor, whitener: Whitener, rank: int) -> LowRankFactors:
    """The rank-`rank` `W_hat` minimising `||S (W - W_hat)||_F` (float64 factors). W is [d_in, d_out]."""
    u, sigma, vh = whitened_svd(w, whitener)
    return truncate_whitened_svd(u, sigma, vh, whitener, rank)


def weighted_error(delta: torch.Tensor, c: torch.Tensor) -> float:
    """`trace(Delta^T C Delta)` = mean over rows of ||x Delta||^2 when C is the (uncentred) second moment. float64."""
    delta = delta.double()
    return float(torch.einsum("ij,ik,kj->", delta, c.double(), delta))


def relative_activation_error(w: torch.Tensor, w_hat: torch.Tensor, c: torch.Tensor) -> float:
    """`||X (W - W_hat)||_F / ||X W||_F` computed from the second moment C of X, by the trace identity."""
    reference = weighted_error(w, c)
    if reference <= 0:
        raise NumericalError("||X W|| is zero: the activations or the weight vanish")
    return (weighted_error(w.double() - w_hat.double(), c) / reference) ** 0.5


def greedy_rank_allocation(
    num_items: int,
    budget: int,
    priority: Callable[[int, int], float],
    min_rank: int | Sequence[int],
    max_rank: int | Sequence[int],
) -> list[int]:
    """Water-filling: start every item at its minimum and hand out one rank at a time to the highest priority.

    `priority(i, r)` scores giving item i its (r+1)-th rank while it holds r. Returns ranks summing to `budget`,
    each within [min_rank_i, max_rank_i]. Ties go to the lowest index, so the result is deterministic. Items at
    their maximum are skipped. With identical items and a priority that does not increase with r, the result is as
    even as the budget allows (round-robin).
    """
    if num_items < 1:
        raise InvalidInputError("rank allocation needs at least one item")
    lows = [min_rank] * num_items if isinstance(min_rank, int) else list(min_rank)
    highs = [max_rank] * num_items if isinstance(max_rank, int) else list(max_rank)
    if len(lows) != num_items or len(highs) != num_items:
        raise InvalidInputError(f"min/max rank lists must have {num_items} entries")
    if any(lo < 0 or lo > hi for lo, hi in zip(lows, highs)):
        raise InvalidInputError(f"each item needs 0 <= min_rank <= max_rank, got min {lows} max {highs}")
    if not sum(lows) <= budget <= sum(highs):
        raise InvalidInputError(f"budget {budget} is outside the reachable range [{sum(lows)}, {sum(highs)}] given the rank bounds")
    ranks = list(lows)
    for _ in range(budget - sum(lows)):
        best, best_score = -1, float("-inf")
        for i in range(num_items):
            if ranks[i] >= highs[i]:
                continue
            score = float(priority(i, ranks[i]))
            if score != score:
                raise NumericalError(f"rank priority of item {i} at rank {ranks[i]} is NaN")
            # strict '>': an equal score later never displaces the lower index; the first open item is the default
            if best < 0 or score > best_score:
                best, best_score = i, score
        ranks[best] += 1
    return ranks
