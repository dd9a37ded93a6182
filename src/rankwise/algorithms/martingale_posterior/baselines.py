"""The frequentist and Bayesian-bootstrap baselines for the mean score, batched over data sets.

All take scores [n] or [T, n] and return (low, high): floats, or arrays [T]. Percentile intervals for the two
bootstraps, a t_{n-1} interval on the leave-one-out pseudo-values for the jackknife.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

from rankwise.algorithms.martingale_posterior._checks import as_rng, as_scores, check_count, check_level
from rankwise.errors import InvalidInputError

MAX_BLOCK = 4_000_000  # resampled values per block


def _shape(scores: Any) -> tuple[np.ndarray, bool]:
    z = as_scores(scores)
    return (z[None], True) if z.ndim == 1 else (z, False)


def _out(low: np.ndarray, high: np.ndarray, single: bool):
    return (float(low[0]), float(high[0])) if single else (low, high)


def bootstrap_draws(scores: Any, *, draws: int = 1000, bayesian: bool = False,
                    seed: int | np.random.Generator | None = None) -> np.ndarray:
    """Resampled means [draws] or [T, draws]: multinomial resampling (nonparametric bootstrap) or, with
    `bayesian`, Dir(1, ..., 1) weights (Bayesian bootstrap)."""
    z, single = _shape(scores)
    t, n = z.shape
    draws = check_count(draws, "draws")
    rng = as_rng(seed)
    out = np.empty((t, draws))
    per_block = max(1, MAX_BLOCK // (draws * n))
    for start in range(0, t, per_block):
        zb = z[start:start + per_block]
        if bayesian:
            w = rng.standard_exponential((zb.shape[0], draws, n))
            out[start:start + zb.shape[0]] = np.einsum("tbn,tn->tb", w, zb) / w.sum(-1)
        else:
            idx = rng.integers(0, n, (zb.shape[0], draws, n))
            out[start:start + zb.shape[0]] = np.take_along_axis(zb[:, None, :], idx, axis=2).mean(-1)
    return out[0] if single else out


def bootstrap_interval(scores: Any, level: float = 0.9, *, draws: int = 1000,
                       seed: int | np.random.Generator | None = None):
    """Nonparametric bootstrap percentile interval of the mean."""
    lo_p, hi_p = check_level(level)
    q = np.quantile(bootstrap_draws(scores, draws=draws, seed=seed), [lo_p, hi_p], axis=-1)
    return _out(np.atleast_1d(q[0]), np.atleast_1d(q[1]), np.ndim(q[0]) == 0)


def bayesian_bootstrap_interval(scores: Any, level: float = 0.9, *, draws: int = 1000,
                                seed: int | np.random.Generator | None = None):
    """Bayesian bootstrap (Dir(1, ..., 1) weights) percentile interval of the mean."""
    lo_p, hi_p = check_level(level)
    q = np.quantile(bootstrap_draws(scores, draws=draws, bayesian=True, seed=seed), [lo_p, hi_p], axis=-1)
    return _out(np.atleast_1d(q[0]), np.atleast_1d(q[1]), np.ndim(q[0]) == 0)


def jackknife_interval(scores: Any, level: float = 0.9):
    """Jackknife: pseudo-values n theta - (n-1) theta_(-i), interval mean +- t_{n-1} sd / sqrt(n). Needs n >= 2.

    For the mean the pseudo-values are the scores themselves, so this is the t interval; it is written for the
    general case so a reader can check that.
    """
    z, single = _shape(scores)
    t, n = z.shape
    if n < 2:
        raise InvalidInputError(f"the jackknife needs n >= 2 scores, got n = {n}")
    _, hi_p = check_level(level)
    full = z.mean(-1, keepdims=True)
    loo = (z.sum(-1, keepdims=True) - z) / (n - 1)
    pseudo = n * full - (n - 1) * loo
    centre = pseudo.mean(-1)
    half = stats.t.ppf(hi_p, n - 1) * pseudo.std(-1, ddof=1) / np.sqrt(n)
    return _out(centre - half, centre + half, single)
