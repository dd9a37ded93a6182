"""The five ways to factor a layer's k_proj / v_proj at rank r, as whitened SVDs (weights W [kv_width, D], torch layout).

Every method is "SVD of W S^T, keep the top r, undo S" for a method-specific whitener S on the input side:

  svd      S = I                       plain per-matrix SVD (Palu's initialisation); minimises the weight error
  asvd     S = diag(rms(x))^alpha      ASVD's activation-scaled columns, alpha = 0.5
  svd-llm  S = chol(C_d)^T             SVD-LLM's Cholesky whitening of the damped second moment
  care     S = sqrt(C_d)               CARE: symmetric square root by float64 eigh; minimises the activation error
  mha2mla  S = I on [W_K; W_V]        MHA2MLA-style joint SVD: one shared down-projection for K and V

SVD-LLM and CARE optimise the same objective ||X (W - W_hat)^T|| (S^T S = C in both), so with equal damping they
give the same W_hat; they differ here only by their authors' default damping (0.01 and 0.1 of mean(diag C)).
The singular values of W S^T drive the rank allocation (`allocation.py`).
"""

from __future__ import annotations

import math

from dataclasses import dataclass

import torch

from rankwise.core.calibration import SecondMoment
from rankwise.core.linalg import (
    LowRankFactors,
    Whitener,
    cholesky_whitener,
    diagonal_whitener,
    identity_whitener,
    sqrt_whitener,
    truncate_whitened_svd,
    whitened_svd,
)
from rankwise.errors import InvalidInputError, UnknownNameError

METHODS: dict[str, str] = {
    "svd": "plain SVD of each matrix (Palu)",
    "asvd": "activation-scaled SVD, columns scaled by rms(x)^0.5 (ASVD)",
    "svd-llm": "Cholesky-whitened SVD (SVD-LLM)",
    "mha2mla": "joint SVD of [W_K | W_V] with a shared latent (MHA2MLA-style)",
    "care": "sqrt(C)-whitened SVD (CARE)",
}
ALIASES = {"palu": "svd", "svdllm": "svd-llm"}
DEFAULT_DAMPING = {"svd": 0.0, "asvd": 0.0, "svd-llm": 0.01, "mha2mla": 0.0, "care": 0.1}
NEEDS_CALIBRATION = {"asvd", "svd-llm", "care"}
JOINT_METHODS = {"mha2mla"}
ASVD_ALPHA = 0.5


def canonical_method(method: str) -> str:
    name = ALIASES.get(method, method)
    if name not in METHODS:
        raise UnknownNameError(f"unknown factorization method {method!r}; choose one of {sorted(METHODS)}")
    return name


def check_damping(damping: float | None) -> None:
    """None (the method's default) or a finite number >= 0; NaN is refused here rather than blamed on the data later."""
    if damping is None:
        return
    if isinstance(damping, bool) or not isinstance(damping, (int, float)) or not 0.0 <= damping < math.inf:
        raise InvalidInputError(f"damping must be a finite number >= 0, got {damping!r}")


def make_whitener(method: str, moment: SecondMoment | None, damping: float | None = None) -> Whitener:
    """The whitener S of `method` for inputs with second moment `moment` (None for the data-free methods)."""
    method = canonical_method(method)
    if method not in NEEDS_CALIBRATION:
        return identity_whitener()
    if moment is None:
        raise InvalidInputError(f"method {method!r} needs calibration data (input second moments); pass calibration=")
    damping = DEFAULT_DAMPING[method] if damping is None else damping
    check_damping(damping)
    if method == "asvd":
        rms = moment.covariance().diagonal().clamp_min(0).sqrt()
        return diagonal_whitener(rms.clamp_min(1e-6) ** ASVD_ALPHA)
    c = moment.covariance(damping)
    return cholesky_whitener(c) if method == "svd-llm" else sqrt_whitener(c)


@dataclass
class WhitenedDecomposition:
    """The full whitened SVD of one matrix (or of [W_K; W_V] for joint methods), ready to truncate at any rank.

    u [out, k], sigma [k] (descending), vh [k, D] with k = min(out, D); `split` is the K width for joint ones.
    """

    u: torch.Tensor
    sigma: torch.Tensor
    vh: torch.Tensor
    whitener: Whitener
    split: int | None = None

    @property
    def max_rank(self) -> int:
        return self.sigma.numel()

    def truncate(self, rank: int) -> LowRankFactors:
        return truncate_whitened_svd(self.u, self.sigma, self.vh, self.whitener, rank)


def decompose_layer(w_k: torch.Tensor, w_v: torch.Tensor, method: str, moment: SecondMoment | None, damping: float | None = None) -> list[WhitenedDecomposition]:
    """Whitened SVDs of one layer: [K, V] for per-matrix methods, [KV] for joint ones. W_* are [kv_width, D]."""
    method = canonical_method(method)
    whitener = make_whitener(method, moment, damping)
    if method in JOINT_METHODS:
        joint = torch.cat([w_k.double(), w_v.double()], dim=0)
        return [WhitenedDecomposition(*whitened_svd(joint, whitener), whitener, split=w_k.size(0))]
    return [WhitenedDecomposition(*whitened_svd(w, whitener), whitener) for w in (w_k, w_v)]


def split_joint(factors: LowRankFactors, split: int) -> tuple[LowRankFactors, LowRankFactors]:
    """K and V factors of a joint factorization: the same down-projection, the up-projection cut at row `split`."""
    k = LowRankFactors(factors.down, factors.up[:split], factors.singular_values)
    v = LowRankFactors(factors.down, factors.up[split:], factors.singular_values)
    return k, v
