"""Fake quantization: quantize then dequantize, so a float model computes with exactly the values a block-quantized
deployment would hold. Weights are quantized once, in place; activations optionally on the fly, at every call."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from rankwise.core.progress import progress
from rankwise.errors import InvalidInputError
from rankwise.core.threads import limit_threads
from rankwise.quant.block import QUANT_NUM_THREADS, BlockRecipe, quantize


def fake_quantize(x: torch.Tensor, recipe: BlockRecipe, pad: bool = True) -> torch.Tensor:
    """x [..., K] -> float32 [..., K] on the recipe's grid. With pad=True a ragged last block is zero-padded."""
    return quantize(x, recipe, pad=pad).dequantize()


@dataclass(frozen=True)
class ErrorStats:
    numel: int
    mse: float  # mean squared error, computed in float64
    signal_power: float  # mean of x^2
    sqnr_db: float  # 10 log10(signal_power / mse); inf for an exact reconstruction

    @property
    def relative_mse(self) -> float:
        return self.mse / self.signal_power if self.signal_power > 0 else float("nan")


def error_stats(x: torch.Tensor, x_hat: torch.Tensor) -> ErrorStats:
    """Measured reconstruction error of x_hat against x (same shape)."""
    if x.shape != x_hat.shape:
        raise InvalidInputError(f"shapes differ: {tuple(x.shape)} vs {tuple(x_hat.shape)}")
    # Differences in float32 (x and x_hat are float32 and close, so x - x_hat is exact or within 2^-24 of itself),
    # sums of squares accumulated in float64: the card's float64 MSE at a quarter of the memory traffic.
    x = x.float()
    d = x - x_hat.float()
    n = max(x.numel(), 1)
    mse = float(torch.sum(d * d, dtype=torch.float64)) / n
    power = float(torch.sum(x * x, dtype=torch.float64)) / n
    return ErrorStats(x.numel(), mse, power, _sqnr_db(power, mse))


def _sqnr_db(power: float, mse: float) -> float:
    if mse == 0:
        return math.inf
    return 10 * math.log10(power / mse) if power > 0 else -math.inf


class FakeQuantLinear(nn.Module):
    """An nn.Linear whose weight is already fake-quantized and whose input is fake-quantized at every call
    (blocks along the input-feature dimension, as a block-scaled matmul consumes them)."""

    def __init__(self, linear: nn.Linear, activation_recipe: BlockRecipe):
        super().__init__()
        self.linear = linear
        self.activation_recipe = activation_recipe

    @property
    def weight(self) -> nn.Parameter:
        return self.linear.weight

    @property
    def bias(self) -> nn.Parameter | None:
        return self.linear.bias

    @property
    def in_features(self) -> int:  # so that code walking a model's linears by shape sees through the wrapper
        return self.linear.in_features

    @property
    def out_features(self) -> int:
        return self.linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(fake_quantize(x, self.activation_recipe).to(x.dtype))

    def extra_repr(self) -> str:
        return f"activations: {self.activation_recipe.describe()}"


def quantizable_linears(model: nn.Module, exclude: tuple[str, ...] = ("lm_head",)) -> list[tuple[str, nn.Linear]]:
    """The model's nn.Linear modules by qualified name, except those whose name ends with an `exclude` entry.

    The default keeps `lm_head` in full precision: in SmolLM2 it is tied to the token embedding, and FP4 weight
    studies (the paper's among them) quantize the transformer blocks' linears only.
    """
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and not any(n == e or n.endswith("." + e) for e in exclude)]


@torch.no_grad()
def quantize_linears_(model: nn.Module, recipe: BlockRecipe, activations: BlockRecipe | None = None,
                      exclude: tuple[str, ...] = ("lm_head",), scale_weights: float = 1.0) -> dict[str, ErrorStats]:
    """Fake-quantize every nn.Linear weight of `model` in place (blocks along in_features); return the measured
    weight error per layer. With `activations`, each such Linear is wrapped in `FakeQuantLinear`.

    `scale_weights` = alpha quantizes alpha * W and divides by alpha again: the card's way of narrowing the weight
    distribution without changing the model's function (alpha = 1 is plain quantization).
    """
    if scale_weights <= 0:
        raise InvalidInputError(f"scale_weights must be positive, got {scale_weights}")
    layers = quantizable_linears(model, exclude)
    if not layers:
        raise InvalidInputError(f"{type(model).__name__} has no nn.Linear to quantize (exclude={exclude})")
    stats = {}
    for name, linear in progress(layers, desc=f"quantize {recipe.name}"):
        w = linear.weight
        with limit_threads(QUANT_NUM_THREADS):
            w_hat = fake_quantize(w.float() * scale_weights, recipe) / scale_weights
            stats[name] = error_stats(w, w_hat)
            w.copy_(w_hat.to(w.dtype))
        if activations is not None:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, FakeQuantLinear(linear, activations))
    return stats


def quantized_copy(model: nn.Module, recipe: BlockRecipe, **kwargs) -> tuple[nn.Module, dict[str, ErrorStats]]:
    """A deep copy of `model` with fake-quantized linears (the original is untouched)."""
    clone = copy.deepcopy(model)
    return clone, quantize_linears_(clone, recipe, **kwargs)


def total_error(stats: dict[str, ErrorStats]) -> ErrorStats:
    """Pool per-layer errors into one, weighting by element count."""
    n = sum(s.numel for s in stats.values())
    mse = sum(s.mse * s.numel for s in stats.values()) / n
    power = sum(s.signal_power * s.numel for s in stats.values()) / n
    return ErrorStats(n, mse, power, _sqnr_db(power, mse))
