"""The predictive rule P_i = (alpha Q + sum_{j<=i} delta_{y_j}) / (alpha + i) and what follows from it.

The mixing weight lambda_i = alpha / (i + alpha) is the only predictable affine schedule under which theta(P_i) is a
martingale for every bounded score (the card's Theorem 1); a fixed lambda or an updated generator is not.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rankwise.algorithms.martingale_posterior._checks import as_alpha, as_scores
from rankwise.errors import InvalidInputError


def mixing_weight(i: Any, alpha: float) -> np.ndarray | float:
    """lambda_i = alpha / (i + alpha): the weight of the generator after i observations (0 at alpha = 0, -> 1 as
    alpha -> inf). `i` is a count >= 0 (array or scalar); at i = alpha = 0 the weight is taken as 0 (no prior mass)."""
    a = float(as_alpha(alpha, None)[0])
    i_arr = np.asarray(i, dtype=np.float64)
    if np.any(i_arr < 0) or not np.all(np.isfinite(i_arr)):
        raise InvalidInputError(f"i must be finite counts >= 0, got {i}")
    denom = i_arr + a
    lam = np.divide(a, denom, out=np.zeros_like(denom), where=denom > 0)
    return float(lam) if lam.ndim == 0 else lam


def predictive_mean(scores: Any, alpha: Any, model_mean: Any) -> np.ndarray | float:
    """theta(P_n) = (n zbar + alpha theta(Q)) / (n + alpha) = E[theta_inf | F_n]: the current forecast of the metric.

    scores [n] or [T, n]; alpha and model_mean scalars or [T]. Returns a float or [T].
    """
    z = as_scores(scores)
    batch = None if z.ndim == 1 else z.shape[0]
    a = as_alpha(alpha, batch)
    m = np.broadcast_to(np.asarray(model_mean, dtype=np.float64), a.shape)
    n = z.shape[-1]
    out = (z.sum(-1) + a * m) / (n + a)
    return float(out[0]) if batch is None else out


def drift_bound(t: int, alpha: float, bound: float, delta: float) -> float:
    """The card's Theorem 6 (Freedman-type): with probability >= 1 - delta,
    sup_{s >= t} |theta(P_s) - theta(P_t)| <= H sqrt(2 log(2/delta) / (t + alpha)) + 2H log(2/delta) / (3 (t + alpha + 1))
    for a score with |h| <= H = `bound`. At t = n it bounds how far the forecasts can still move; at t = n + M it
    bounds what a forward simulation of horizon M leaves out."""
    a = float(as_alpha(alpha, None)[0])
    if not (isinstance(t, (int, np.integer)) and t >= 0) or t + a <= 0:
        raise InvalidInputError(f"t must be an int >= 0 with t + alpha > 0, got t = {t}, alpha = {a}")
    if not (math.isfinite(bound) and bound > 0):
        raise InvalidInputError(f"bound H must be finite and > 0, got {bound}")
    if not 0.0 < delta < 1.0:
        raise InvalidInputError(f"delta must be in (0, 1), got {delta}")
    log_term = math.log(2.0 / delta)
    return bound * math.sqrt(2.0 * log_term / (t + a)) + 2.0 * bound * log_term / (3.0 * (t + a + 1.0))
