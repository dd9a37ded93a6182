"""The three-term error model of block FP4 quantization with quantized scales (the card's reconstruction of the paper).

Model: the k elements of a block are iid N(0, sigma^2); M = max |x_i|; the block gets the scale s_hat = Q_S(M / 6)
(whatever the recipe's scale rule makes of it, global scale included); x_hat = s_hat * Q_E(x / s_hat). The mean
squared error per element splits into disjoint parts:

  element    ((k-1)/k) * E[ 1[s_hat > 0] * E_{|x| <= M}[(x - s_hat Q_E(x / s_hat))^2] ]   ordinary rounding
  max        (1/k)     * E[ 1[s_hat > 0] * (M - s_hat Q_E(M / s_hat))^2 ]                  0 when s_hat = M / 6
  zero       E[ 1[s_hat = 0] * (((k-1)/k) E_{|x| <= M}[x^2] + M^2 / k) ]                   a flushed block

The outer expectation is a quadrature over the density of M, f(m) = k 2 phi(m) (2 Phi(m) - 1)^(k-1); the inner one
is exact, as Gaussian partial moments over the element format's rounding bins. `measured_terms` splits a real
quantization's error the same way, so model and measurement compare term by term.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.special import ndtr

from rankwise.errors import InvalidInputError
from rankwise.quant.block import BlockRecipe, effective_scales, global_scale_for, quantize

_SQRT_2PI = np.sqrt(2 * np.pi)
TAIL = 12.0  # the quadrature over m stops at TAIL * sigma; P(M > 12 sigma) < 1e-30 * k


@dataclass(frozen=True)
class ErrorTerms:
    """Per-element mean squared error, split into the model's three parts (float64)."""

    element: float
    max_element: float
    zero_block: float

    @property
    def total(self) -> float:
        return self.element + self.max_element + self.zero_block


def _phi(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / _SQRT_2PI


def _sq_error_moment(lo: np.ndarray, hi: np.ndarray, c: np.ndarray, sigma: float) -> np.ndarray:
    """Integral over lo <= x <= hi of (x - c)^2 * 2 phi_sigma(x) dx (the factor 2 folds in negative x)."""
    a, b = lo / sigma, hi / sigma
    p0 = ndtr(b) - ndtr(a)
    p1 = sigma * (_phi(a) - _phi(b))
    p2 = sigma**2 * (p0 + a * _phi(a) - np.where(np.isinf(b), 0.0, b * _phi(b)))
    return 2 * (p2 - 2 * c * p1 + c * c * p0)


def gaussian_terms(sigma: float, recipe: BlockRecipe, global_scale: float = 1.0, points: int = 4000) -> ErrorTerms:
    """The model's three terms for iid N(0, sigma^2) data under `recipe` (its block size; the global scale S given)."""
    if not sigma > 0:
        raise InvalidInputError(f"sigma must be positive, got {sigma}")
    k = recipe.block_size
    m = np.linspace(0.0, TAIL * sigma, points + 1)[1:]
    cdf_m = 2 * ndtr(m / sigma) - 1  # P(|x| <= m)
    density = k * 2 * _phi(m / sigma) / sigma * cdf_m ** (k - 1)
    dm = m[1] - m[0]
    weights = density * dm  # simple rectangle rule on a fine grid; the integrand has steps (scale rounding)

    s_hat = effective_scales(torch.from_numpy(m).float(), recipe, global_scale).numpy()
    live = s_hat > 0
    safe = np.where(live, s_hat, 1.0)
    elem = recipe.element
    grid = elem.magnitudes[: elem.max_code + 1].numpy()
    q_max = elem.round(torch.from_numpy(m / safe)).numpy()
    max_err = (m - safe * q_max) ** 2

    # Ordinary elements: |x| uniform-in-law on [0, m] under the truncated normal; bin j of the element grid covers
    # [s mid_{j-1}, s mid_j] and reconstructs to s grid_j (the last bin, to saturation, reconstructs to s * max).
    mids = np.concatenate([[0.0], (grid[1:] + grid[:-1]) / 2, [np.inf]])
    ordinary = np.zeros_like(m)
    for j, value in enumerate(grid):
        lo = np.minimum(safe * mids[j], m)
        hi = np.minimum(safe * mids[j + 1], m)
        ordinary += _sq_error_moment(lo, hi, safe * value, sigma)
    ordinary /= np.maximum(cdf_m, 1e-300)
    second_moment = _sq_error_moment(np.zeros_like(m), m, np.zeros_like(m), sigma) / np.maximum(cdf_m, 1e-300)

    element = float(np.sum(weights * live * ordinary) * (k - 1) / k)
    max_element = float(np.sum(weights * live * max_err) / k)
    zero = float(np.sum(weights * ~live * ((k - 1) / k * second_moment + m**2 / k)))
    return ErrorTerms(element, max_element, zero)


def measured_terms(x: torch.Tensor, recipe: BlockRecipe) -> ErrorTerms:
    """The same split of a real quantization's error: flushed blocks, each block's largest element, the rest.
    x [..., K] with K a multiple of the block size."""
    q = quantize(x, recipe)
    k = recipe.block_size
    blocks = x.detach().double().reshape(-1, k)
    err = (blocks - q.dequantize().double().reshape(-1, k)) ** 2
    flushed = (effective_scale_of(q).reshape(-1) == 0).unsqueeze(-1)
    is_max = torch.zeros_like(err, dtype=torch.bool)
    is_max.scatter_(1, blocks.abs().argmax(dim=1, keepdim=True), True)
    n = x.numel()
    zero = float(err[flushed.expand_as(err)].sum()) / n
    max_element = float(err[is_max & ~flushed].sum()) / n
    element = float(err[~is_max & ~flushed].sum()) / n
    return ErrorTerms(element, max_element, zero)


def effective_scale_of(q) -> torch.Tensor:
    """s_b * S of a QuantizedTensor's blocks (float64)."""
    return q.scale_values() * q.global_scale.double()


@dataclass(frozen=True)
class TensorPrediction:
    predicted: ErrorTerms
    measured: ErrorTerms
    sigma_median: float  # median row standard deviation

    @property
    def ratio(self) -> float:
        """predicted / measured total MSE (1 = perfect)."""
        return self.predicted.total / self.measured.total if self.measured.total > 0 else float("nan")


def predict_tensor(w: torch.Tensor, recipe: BlockRecipe, sigma_points: int = 12, points: int = 2000) -> TensorPrediction:
    """Model vs measurement for one weight matrix w [rows, K]: each row is treated as Gaussian with its own sigma
    (weights' spread varies a lot between rows); the model is evaluated on a log-spaced sigma grid and interpolated.
    The global scale S is the one the real tensor gets."""
    if w.dim() != 2:
        raise InvalidInputError(f"predict_tensor wants a 2-D weight, got shape {tuple(w.shape)}")
    w = w.detach().float()
    sig = w.double().pow(2).mean(dim=1).sqrt().numpy()  # zero-mean Gaussian model: sigma = row rms
    s = float(global_scale_for(w.abs().max(), recipe))
    positive = sig[sig > 0]
    lo, hi = float(positive.min()), float(positive.max())
    grid = np.geomspace(lo, hi, sigma_points) if hi > lo * 1.0001 else np.array([lo])
    table = [gaussian_terms(g, recipe, s, points) for g in grid]

    def interp(values: list[float]) -> float:
        v = np.asarray(values)
        if len(grid) == 1:
            per_row = np.full_like(positive, v[0])
        else:  # the MSE varies smoothly on log-log axes between grid points
            per_row = np.exp(np.interp(np.log(positive), np.log(grid), np.log(np.maximum(v, 1e-300))))
        return float(per_row.sum() / len(sig))  # zero rows contribute zero error

    predicted = ErrorTerms(interp([t.element for t in table]), interp([t.max_element for t in table]),
                           interp([t.zero_block for t in table]))
    return TensorPrediction(predicted, measured_terms(w, recipe), float(np.median(sig)))


def monte_carlo_terms(sigma: float, recipe: BlockRecipe, num_blocks: int, seed: int = 0) -> ErrorTerms:
    """The measured split on `num_blocks` blocks of iid N(0, sigma^2) data (global scale from the sample)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_blocks, recipe.block_size, generator=gen, dtype=torch.float32) * sigma
    return measured_terms(x, recipe)
