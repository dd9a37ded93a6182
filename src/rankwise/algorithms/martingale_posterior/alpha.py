"""Choosing alpha, the one hyperparameter: the small-n minimax rule of the card's Theorem 2.

Over the ambiguity set {F*: Var h <= sigma^2, |theta(Q) - theta(F*)| <= Delta}, the shrinkage estimator
(1 - lambda) zbar + lambda theta(Q) has worst-case risk (1 - lambda)^2 a + lambda^2 Delta^2 with a = sigma^2 / n; it is
minimised by lambda* = a / (a + Delta^2), i.e. alpha* = sigma^2 / Delta^2 (independent of n), with minimax risk
a Delta^2 / (a + Delta^2). The data-driven alpha-hat plugs in a calibration sample's variance and a margin-inflated
mismatch, and clips to [5, 200] (the authors' code).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rankwise.algorithms.martingale_posterior._checks import as_scores
from rankwise.errors import InvalidInputError

ALPHA_BOUNDS = (5.0, 200.0)


def shrinkage_risk(lam: Any, a: float, delta: float) -> np.ndarray | float:
    """Worst-case squared error of (1 - lam) zbar + lam theta(Q) over the ambiguity set: (1-lam)^2 a + lam^2 Delta^2."""
    lam_arr = np.asarray(lam, dtype=np.float64)
    out = (1.0 - lam_arr) ** 2 * a + lam_arr**2 * delta**2
    return float(out) if out.ndim == 0 else out


def minimax_risk(a: float, delta: float) -> float:
    """R*(a, Delta) = a Delta^2 / (a + Delta^2), the risk at lambda* = a / (a + Delta^2)."""
    if a < 0 or delta < 0 or a + delta**2 == 0:
        raise InvalidInputError(f"need a >= 0, Delta >= 0, not both 0; got a = {a}, Delta = {delta}")
    return a * delta**2 / (a + delta**2)


def minimax_alpha(sigma2: float, delta: float) -> float:
    """alpha* = sigma^2 / Delta^2 (inf when Delta = 0: the generator is trusted completely)."""
    if not (math.isfinite(sigma2) and sigma2 >= 0 and math.isfinite(delta) and delta >= 0):
        raise InvalidInputError(f"need finite sigma^2 >= 0 and Delta >= 0, got {sigma2}, {delta}")
    return math.inf if delta == 0 else sigma2 / delta**2


@dataclass(frozen=True)
class AlphaEstimate:
    """alpha-hat and the numbers it came from. `clipped` is "low", "high" or None."""

    alpha: float
    raw: float
    sigma2: float
    delta: float
    model_mean: float
    calibration_mean: float
    calibration_n: int
    clipped: str | None


def estimate_alpha(calibration_scores: Any, model_mean: float, margin: float = 1.0,
                   bounds: tuple[float, float] = ALPHA_BOUNDS) -> AlphaEstimate:
    """alpha-hat = clip(sigma-hat^2 / Delta-hat^2, *bounds), Delta-hat = |theta-hat(Q) - zbar_cal| + margin sqrt(sigma-hat^2 / n_cal).

    calibration_scores [n_cal] (n_cal >= 2): real scores held out from the n used for the interval (the card's code
    uses 150), or the n scores themselves (the card's small-n variant). `model_mean` is theta-hat(Q). The margin
    term keeps Delta-hat away from 0 by the calibration mean's own noise, so a lucky match does not make alpha huge;
    Delta-hat = 0 (possible only at margin 0 or zero variance) gives the upper bound.
    """
    z = as_scores(calibration_scores, "calibration_scores")
    if z.ndim != 1 or z.size < 2:
        raise InvalidInputError(f"calibration_scores must be [n_cal] with n_cal >= 2 (a variance is needed), got shape "
                                f"{z.shape}")
    lo, hi = (float(b) for b in bounds)
    if not (0 <= lo <= hi and math.isfinite(hi)):
        raise InvalidInputError(f"bounds must be 0 <= low <= high < inf, got {bounds}")
    if not (math.isfinite(margin) and margin >= 0):
        raise InvalidInputError(f"margin must be finite and >= 0, got {margin}")
    if not math.isfinite(model_mean):
        raise InvalidInputError(f"model_mean must be finite, got {model_mean}")
    sigma2 = float(z.var(ddof=1))
    delta = abs(float(model_mean) - float(z.mean())) + margin * math.sqrt(sigma2 / z.size)
    raw = math.inf if delta == 0 else sigma2 / delta**2
    alpha = min(max(raw, lo), hi)
    clipped = "low" if raw < lo else "high" if raw > hi else None
    return AlphaEstimate(alpha, raw, sigma2, delta, float(model_mean), float(z.mean()), int(z.size), clipped)
