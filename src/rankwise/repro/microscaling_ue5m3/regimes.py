"""Operating points that separate the mechanisms of the block-size anomaly, defined by the scale formats' ranges.

A narrowing factor per tensor, alpha_t = 2^j, moves the median ideal block scale amax_b / 6 (at the reference block
size) onto a target that sits in one range of UE4M3 (FP8 E4M3 without sign): its normal range [2^-6, 448], its
subnormal range [2^-9, 2^-6), below its flush threshold (amax / 6 <= 2^-10 rounds to 0), or above its maximum. The
target is a property of the formats, not of any measured error, so the points are fixed before anything is
quantized. alpha is a power of two so that UE5M3, E8M0 and the global-scale recipes see exactly alpha times the
same scales: their error at a point where their scales stay normal equals the error at alpha = 1 by construction
(the report checks that as an invariant), and only the format whose range is crossed can change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rankwise.errors import InvalidInputError
from rankwise.quant.block import BlockRecipe, effective_scales

# log2 of the median ideal block scale each regime targets (UE4M3: normal >= 2^-6, subnormal 2^-9..2^-6,
# flush <= 2^-10, max 448 ~ 2^8.8; UE5M3: normal >= 2^-14, max 114688 ~ 2^16.8).
REGIME_TARGETS_LOG2 = {
    "normal": -3.0,      # three octaves inside UE4M3's normal range: the scales' relative precision is 2^-4
    "subnormal": -7.5,   # the geometric middle of UE4M3's subnormal range [2^-9, 2^-6)
    "flush": -12.0,      # two octaves below UE4M3's flush threshold, still inside UE5M3's normal range
    "saturate": 11.0,    # two octaves above UE4M3's maximum, six below UE5M3's
}
REFERENCE_BLOCK = 16  # the block size whose median scale is placed on the target


def block_amax(w: torch.Tensor, k: int) -> torch.Tensor:
    """Per-block max |w| along the last dimension (zero-padded to a multiple of k). w [..., K] -> [numel / k]."""
    if k < 1:
        raise InvalidInputError(f"block size must be positive, got {k}")
    flat = w.detach().float().reshape(-1, w.shape[-1])
    pad = (-flat.shape[-1]) % k
    if pad:
        flat = torch.nn.functional.pad(flat, (0, pad))
    return flat.reshape(-1, k).abs().amax(-1)


def regime_alpha(w: torch.Tensor, target_log2: float, k: int = REFERENCE_BLOCK) -> float:
    """The power of two 2^j that puts the median of amax_b / 6 (block size k) of `alpha * w` nearest 2^target_log2
    (in log2). w [out, in] -> alpha (float)."""
    med = float(block_amax(w, k).median()) / 6.0
    if not med > 0:
        raise InvalidInputError("a tensor whose median block is all zero has no scale to place")
    return 2.0 ** round(target_log2 - math.log2(med))


def regime_alphas(weights: list[tuple[str, torch.Tensor]], regime: str) -> dict[str, float]:
    """alpha per tensor name for one regime of `REGIME_TARGETS_LOG2` (1.0 for regime "as-is")."""
    if regime == "as-is":
        return {n: 1.0 for n, _ in weights}
    if regime not in REGIME_TARGETS_LOG2:
        raise InvalidInputError(f"regime must be 'as-is' or one of {sorted(REGIME_TARGETS_LOG2)}, got {regime!r}")
    return {n: regime_alpha(w, REGIME_TARGETS_LOG2[regime]) for n, w in weights}


@dataclass(frozen=True)
class ScaleCensus:
    """Shares of blocks (over all tensors) whose *ideal* scale amax / 6 falls in each range of a scale format, and
    the share whose quantized scale is 0 (flushed) or at the format's maximum (saturated)."""

    blocks: int
    normal: float
    subnormal: float
    flushed: float
    saturated: float
    median_log2_scale: float


def scale_census(weights: list[tuple[str, torch.Tensor]], alphas: dict[str, float], recipe: BlockRecipe) -> ScaleCensus:
    """Where the ideal block scales of alpha_t * W_t land in `recipe`'s scale format (no global scale assumed).
    Blocks with amax = 0 are left out (they have no scale to place)."""
    if recipe.scale is None:
        raise InvalidInputError(f"recipe {recipe.name} has no quantized scale to take a census of")
    fmt = recipe.scale
    ideal, real = [], []
    for n, w in weights:
        amax = block_amax(w * alphas[n], recipe.block_size)
        amax = amax[amax > 0]
        ideal.append(amax.double() / recipe.element.max)
        real.append(effective_scales(amax, recipe))
    s, r = torch.cat(ideal), torch.cat(real)
    n = s.numel()
    flushed = r == 0
    saturated = (r >= fmt.max) & (s > fmt.max)
    sub = (s < fmt.min_normal) & ~flushed
    return ScaleCensus(n, float(((s >= fmt.min_normal) & ~saturated).sum()) / n, float(sub.sum()) / n,
                       float(flushed.sum()) / n, float(saturated.sum()) / n, float(torch.log2(s).median()))


def narrowed_quantize(weights: list[tuple[str, torch.Tensor]], alphas: dict[str, float], quantizer) -> dict[str, torch.Tensor]:
    """W_t -> quantizer(alpha_t * W_t) / alpha_t for every tensor (the card's narrowing, one alpha per tensor)."""
    return {n: quantizer(w * alphas[n]) / alphas[n] for n, w in weights}
