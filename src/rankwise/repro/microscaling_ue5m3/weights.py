"""B. Real weights at the mechanism-separating operating points: SQNR per block size, the scale census, the error
split into its three terms, and the invariance of the formats whose range a point does not cross."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.core.progress import progress
from rankwise.quant.block import get_recipe, quantize
from rankwise.quant.error_model import ErrorTerms, measured_terms
from rankwise.quant.fake_quant import ErrorStats, error_stats, fake_quantize, quantizable_linears, total_error
from rankwise.quant.formats import UE5M3
from rankwise.repro.microscaling_ue5m3.regimes import ScaleCensus, block_amax, regime_alphas, scale_census

Weights = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class PointResult:
    """One (regime, scale, k): pooled error of the reconstruction W_hat = Q(alpha W) / alpha, its three terms in
    W's units (per element, pooled over tensors), and the census of the ideal scales (minifloat scales only)."""

    error: ErrorStats
    terms: ErrorTerms
    census: ScaleCensus | None


def sweep(weights: Weights, regimes: tuple[str, ...], scales: dict[str, str], ks: tuple[int, ...],
          census_for: tuple[str, ...] = ()) -> dict[tuple[str, str, int], PointResult]:
    """{(regime, scale label, k): PointResult} for every combination (recipe names in `scales`)."""
    out = {}
    for regime in regimes:
        alphas = regime_alphas(weights, regime)
        for label, name in progress(list(scales.items()), desc=f"weights {regime}"):
            for k in ks:
                recipe = get_recipe(name, k)
                stats, el, mx, zero, n = {}, 0.0, 0.0, 0.0, 0
                for t, w in weights:
                    a = alphas[t]
                    stats[t] = error_stats(w, fake_quantize(w * a, recipe) / a)
                    if w.shape[-1] % k == 0:
                        m = measured_terms(w * a, recipe)
                        el, mx, zero = el + m.element * w.numel() / a**2, mx + m.max_element * w.numel() / a**2, \
                            zero + m.zero_block * w.numel() / a**2
                        n += w.numel()
                census = scale_census(weights, alphas, recipe) if label in census_for else None
                out[regime, label, k] = PointResult(total_error(stats), ErrorTerms(el / n, mx / n, zero / n), census)
    return out


def ue5m3_changed_blocks(weights: Weights, regime: str, k: int) -> tuple[int, int]:
    """(blocks whose UE5M3 reconstruction differs between `regime` and alpha = 1, blocks compared), over the blocks
    whose ideal scale lies in UE5M3's normal range at both points: by construction 0 differ (alpha is 2^j)."""
    alphas = regime_alphas(weights, regime)
    recipe = get_recipe("fp4-ue5m3", k)
    changed = compared = 0
    for t, w in weights:
        if w.shape[-1] % k:
            continue
        a = alphas[t]
        base = quantize(w, recipe).dequantize().reshape(-1, k)
        moved = (quantize(w * a, recipe).dequantize() / a).reshape(-1, k)
        s0, s1 = block_amax(w, k) / 6, block_amax(w * a, k) / 6
        normal = (s0 >= UE5M3.min_normal) & (s0 <= UE5M3.max) & (s1 >= UE5M3.min_normal) & (s1 <= UE5M3.max)
        changed += int((base[normal] != moved[normal]).any(-1).sum())
        compared += int(normal.sum())
    return changed, compared


def encoder_weights(bert) -> list[tuple[str, torch.Tensor]]:
    """Every quantized nn.Linear weight of MiniLM (its pooler stays fp32), by module name."""
    return [(n, m.weight.detach()) for n, m in quantizable_linears(bert, ("pooler.dense",))]


def llama_weights(llama) -> list[tuple[str, torch.Tensor]]:
    """Every nn.Linear weight of SmolLM2, by module name."""
    return [(n, m.weight.detach()) for n, m in quantizable_linears(llama)]
