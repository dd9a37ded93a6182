"""GQA/MHA -> MLA conversion (one-shot): decompose every layer's K/V, allocate ranks, install the two factors.

    model = convert_to_mla(model, kv_rank=48, method="care", allocation="adjusted", calibration=windows)

The pipeline is three steps so experiments can share the expensive part:
  1. `decompose_kv`   calibration moments -> whitened SVD of every layer's W_K, W_V (or [W_K | W_V]), float64;
  2. `.plan(...)`     per-layer ranks (uniform or adjusted) -> truncated factors, down [r, D] and up [kv_width, r];
  3. `apply_plan`     a copy of the model whose k_proj / v_proj are `LowRankLinear(down, up)`.
RoPE stays where the model applies it, after the up-projection (the paper's one-shot setting, Table 1).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from rankwise.compress.mla.allocation import allocate_ranks
from rankwise.compress.mla.calibration import kv_input_moments
from rankwise.compress.mla.factorize import DEFAULT_DAMPING, JOINT_METHODS, NEEDS_CALIBRATION, check_damping, WhitenedDecomposition, canonical_method, decompose_layer, split_joint
from rankwise.compress.mla.layout import CONFIG_KEY, FORMAT, KVLayout, decoder_layers, dense_kv_weights, kv_layout
from rankwise.compress.mla.modules import LowRankLinear
from rankwise.core.calibration import SecondMoment
from rankwise.core.linalg import LowRankFactors
from rankwise.core.threads import limit_threads
from rankwise.core.progress import progress
from rankwise.errors import InvalidInputError, NumericalError

Calibration = torch.Tensor | Sequence[torch.Tensor] | Sequence[SecondMoment] | Mapping[str, SecondMoment] | None


@dataclass
class MLAPlan:
    """Everything needed to build the converted model: per-layer ranks and (K, V) factors, plus provenance."""

    method: str
    allocation: str
    score: str
    kv_rank: int
    k_ranks: list[int]
    v_ranks: list[int]
    joint: bool
    damping: float
    factors: list[tuple[LowRankFactors, LowRankFactors]] = field(repr=False)

    def record(self) -> dict:
        """The JSON-able description stored in config.json (no tensors)."""
        return {
            "method": self.method, "allocation": self.allocation, "score": self.score, "kv_rank": self.kv_rank,
            "k_ranks": list(self.k_ranks), "v_ranks": list(self.v_ranks), "joint": self.joint, "damping": self.damping,
            "rope": "applied after the up-projection (one-shot form; not a deployable latent cache)",
        }


@dataclass
class KVDecomposition:
    """Whitened SVDs of every layer's K/V projections under one method; truncate to any rank with `plan`."""

    layout: KVLayout
    method: str
    damping: float
    layers: list[list[WhitenedDecomposition]] = field(repr=False)  # per layer: [K, V], or [KV] for joint methods

    @property
    def joint(self) -> bool:
        return self.method in JOINT_METHODS

    def spectra(self, which: int) -> list[torch.Tensor]:
        """Whitened singular values per layer of matrix `which` (0 = K or the joint KV, 1 = V)."""
        return [layer[which].sigma for layer in self.layers]

    def plan(self, kv_rank: int, allocation: str = "uniform", score: str = "paper", min_rank: int | None = None, max_rank: int | None = None) -> MLAPlan:
        """Per-layer factors at mean rank `kv_rank` per matrix (1 <= kv_rank <= kv_width).

        Joint methods get one latent of width 2 * kv_rank per layer, so the cache matches r_K + r_V.
        `min_rank`/`max_rank` bound the adjusted allocation (per matrix; doubled for a joint latent).
        """
        if not isinstance(kv_rank, int) or not 1 <= kv_rank <= self.layout.kv_width:
            raise InvalidInputError(f"kv_rank must be an integer in [1, {self.layout.kv_width}], got {kv_rank!r}")
        if self.joint:
            double = lambda r: None if r is None else 2 * r  # noqa: E731 - bounds scale with the joint width
            k_ranks = v_ranks = allocate_ranks(self.spectra(0), 2 * kv_rank, allocation, score, double(min_rank), double(max_rank))
        else:
            k_ranks = allocate_ranks(self.spectra(0), kv_rank, allocation, score, min_rank, max_rank)
            v_ranks = allocate_ranks(self.spectra(1), kv_rank, allocation, score, min_rank, max_rank)
        with limit_threads(1, at_most=True):
            if self.joint:
                factors = [split_joint(layer[0].truncate(r), self.layout.kv_width) for layer, r in zip(self.layers, k_ranks)]
            else:
                factors = [(layer[0].truncate(rk), layer[1].truncate(rv)) for layer, rk, rv in zip(self.layers, k_ranks, v_ranks)]
        for i, pair in enumerate(factors):
            if not all(torch.isfinite(f.down).all() and torch.isfinite(f.up).all() for f in pair):
                raise NumericalError(f"layer {i}: the {self.method} factors are not finite; increase the damping")
        return MLAPlan(self.method, allocation, score, kv_rank, k_ranks, v_ranks, self.joint, self.damping, factors)


def decompose_kv(model: nn.Module, method: str = "care", calibration: Calibration = None, *, damping: float | None = None, use_cache: bool = True) -> KVDecomposition:
    """Whitened SVD of every layer's K and V under `method` (see `factorize.METHODS`).

    calibration: token ids [N, T] (e.g. `calibration_windows(token_windows(tokenizer, "calibration", 32))`), [B, T] batches, or precollected
    moments; required by asvd, svd-llm and care, ignored by svd and mha2mla. damping: relative to mean(diag C)
    (default: the method's authors' value, 0.1 for care, 0.01 for svd-llm).
    """
    method = canonical_method(method)
    layout = kv_layout(model)
    check_damping(damping)  # before calibration, which is the slow part
    moments: list[SecondMoment | None] = [None] * layout.num_layers
    if method in NEEDS_CALIBRATION:
        if calibration is None:
            raise InvalidInputError(f"method {method!r} needs calibration data: pass calibration=token ids [N, T]")
        moments = kv_input_moments(model, calibration, use_cache=use_cache)
    damping = DEFAULT_DAMPING[method] if damping is None else float(damping)
    layers = []
    with limit_threads(1, at_most=True):
        for i in progress(range(layout.num_layers), desc=f"factorizing K/V ({method})"):
            w_k, w_v = dense_kv_weights(model, i)
            if not (torch.isfinite(w_k).all() and torch.isfinite(w_v).all()):
                raise NumericalError(f"layer {i}: k_proj or v_proj weights contain NaN or Inf")
            layers.append(decompose_layer(w_k, w_v, method, moments[i], damping))
    return KVDecomposition(layout, method, damping, layers)


def apply_plan(model: nn.Module, plan: MLAPlan, inplace: bool = False) -> nn.Module:
    """The model with each layer's k_proj / v_proj replaced by `LowRankLinear` factors from `plan` (fp32).

    Works on a deep copy unless `inplace`; the config records `rankwise_format` and the per-layer ranks.
    """
    layout = kv_layout(model)
    if len(plan.factors) != layout.num_layers:
        raise InvalidInputError(f"the plan has {len(plan.factors)} layers, the model {layout.num_layers}")
    target = model if inplace else copy.deepcopy(model)
    dtype = next(model.parameters()).dtype
    for layer, (k, v) in zip(decoder_layers(target), plan.factors):
        attn = layer.self_attn
        attn.k_proj = LowRankLinear.from_factors(k.down, k.up, _bias(attn.k_proj), dtype)
        attn.v_proj = LowRankLinear.from_factors(v.down, v.up, _bias(attn.v_proj), dtype)
    target.config.rankwise_format = FORMAT
    setattr(target.config, CONFIG_KEY, plan.record())
    return target


def _bias(linear: nn.Linear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.detach()


def convert_to_mla(
    model: nn.Module,
    kv_rank: int,
    method: str = "care",
    allocation: str = "uniform",
    calibration: Calibration = None,
    *,
    score: str = "paper",
    damping: float | None = None,
    min_rank: int | None = None,
    max_rank: int | None = None,
    inplace: bool = False,
    use_cache: bool = True,
) -> nn.Module:
    """Convert a Llama-family GQA/MHA model to one-shot MLA form at `kv_rank` latent dims per matrix per layer.

    kv_rank must be in [1, kv_width) (kv_width = KV heads x head dim, 192 for SmolLM2); the KV saving is
    1 - kv_rank / kv_width. method: svd (Palu), asvd, svd-llm, mha2mla (joint, equal cache) or care.
    allocation: uniform or adjusted (CARE's water-filling, `score` paper or code, separate K and V budgets).
    The original model is left untouched unless `inplace`. Nothing is modified if any step fails.
    """
    layout = kv_layout(model)
    if not isinstance(kv_rank, int) or not 1 <= kv_rank < layout.kv_width:
        raise InvalidInputError(
            f"kv_rank must be an integer in [1, {layout.kv_width - 1}] (below the full KV width {layout.kv_width}, where MLA saves nothing), got {kv_rank!r}"
        )
    decomposition = decompose_kv(model, method, calibration, damping=damping, use_cache=use_cache)
    plan = decomposition.plan(kv_rank, allocation, score, min_rank, max_rank)
    return apply_plan(model, plan, inplace=inplace)
