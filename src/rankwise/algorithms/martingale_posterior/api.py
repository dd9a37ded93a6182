"""The forecast-first uncertainty API: n observed scores of a deployed rule + a frozen generator -> intervals.

    from rankwise.algorithms.martingale_posterior import PoolGenerator, martingale_posterior
    res = martingale_posterior(scores, generator, calibration_scores=cal)   # alpha by the small-n minimax rule
    res.current, res.current_interval    # theta(P_n), the forecast now (its band: Monte-Carlo error of theta(Q))
    res.long_run                         # (low, high) for theta_inf, the limit of the forecasts
    res.draws, res.alpha

`posterior_draws` is the batched form ([T, n] data sets at once) that the reproductions use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from rankwise.algorithms.martingale_posterior._checks import as_alpha, as_rng, as_scores, check_count, check_level
from rankwise.algorithms.martingale_posterior.alpha import ALPHA_BOUNDS, AlphaEstimate, estimate_alpha
from rankwise.algorithms.martingale_posterior.dirichlet import VARIANTS, dirichlet_shortcut
from rankwise.algorithms.martingale_posterior.forward import forward_resample
from rankwise.algorithms.martingale_posterior.generators import ScoreGenerator, model_moments
from rankwise.algorithms.martingale_posterior.schedule import predictive_mean
from rankwise.errors import InvalidInputError

METHODS = ("dirichlet", "forward")


def posterior_draws(scores: Any, generator: ScoreGenerator, alpha: Any, *, method: str = "dirichlet",
                    variant: str = "dp_mean", draws: int = 1000, horizon: int = 1000,
                    seed: int | np.random.Generator | None = None) -> np.ndarray:
    """Martingale-posterior draws of theta_inf: scores [n] or [T, n], alpha scalar or [T] -> [draws] or [T, draws].

    method "dirichlet": the shortcut (M = inf; `variant` dp_mean or single); "forward": forward resampling over
    `horizon` steps.
    """
    if method not in METHODS:
        raise InvalidInputError(f"method must be one of {METHODS}, got {method!r}")
    if method == "forward":
        return forward_resample(scores, generator, alpha, draws=draws, horizon=horizon, seed=seed)
    return dirichlet_shortcut(scores, generator, alpha, draws=draws, variant=variant, seed=seed)


@dataclass(frozen=True)
class MetricUncertainty:
    """What `martingale_posterior` returns.

    current: theta(P_n) = (n zbar + alpha theta-hat(Q)) / (n + alpha), the metric forecast now.
    current_interval: its band at `level` from the Monte-Carlo error of theta-hat(Q) alone (the forecast is a
        known function of the data; only theta(Q) is estimated).
    long_run: (low, high), the central `level` interval of the martingale posterior of theta_inf.
    draws [B]: the posterior draws; alpha: the alpha used; alpha_estimate: how it was chosen (None if given).
    """

    n: int
    level: float
    method: str
    variant: str | None
    alpha: float
    alpha_estimate: AlphaEstimate | None
    model_mean: float
    model_samples: int
    current: float
    current_interval: tuple[float, float]
    long_run: tuple[float, float]
    draws: np.ndarray

    @property
    def width(self) -> float:
        return self.long_run[1] - self.long_run[0]


def martingale_posterior(scores: Any, generator: ScoreGenerator, *, alpha: float | None = None,
                         calibration_scores: Any = None, level: float = 0.9, method: str = "dirichlet",
                         variant: str = "dp_mean", draws: int = 1000, horizon: int = 1000,
                         model_samples: int = 200, alpha_bounds: tuple[float, float] = ALPHA_BOUNDS,
                         margin: float = 1.0, seed: int | np.random.Generator | None = 0) -> MetricUncertainty:
    """Intervals for the current and the long-run value of a deployed rule's mean score.

    scores [n]: h(y_1..y_n) of the n real observations (n >= 1, finite; clip unbounded scores such as NLL).
    generator: the frozen generator as a score sampler, `generator(size, rng) -> [size]` (see `generators`).
    alpha: the prior mass of the generator; None chooses it by the small-n minimax rule (`estimate_alpha`) on
        `calibration_scores` (held-out real scores, the authors' protocol) or, without them, on the n scores
        themselves (needs n >= 2). theta(Q) is estimated from `model_samples` generator draws.
    Everything is checked before any resampling: n = 0, non-finite scores, a generator that returns nothing or
    raises -> `RankwiseError`.
    """
    z = as_scores(scores)
    if z.ndim != 1:
        raise InvalidInputError(f"scores must be one data set [n], got shape {z.shape}; use posterior_draws for "
                                "several at once")
    lo_p, hi_p = check_level(level)
    if method not in METHODS:
        raise InvalidInputError(f"method must be one of {METHODS}, got {method!r}")
    if method == "dirichlet" and variant not in VARIANTS:
        raise InvalidInputError(f"variant must be one of {VARIANTS}, got {variant!r}")
    check_count(draws, "draws")
    check_count(horizon, "horizon", 0)
    model_samples = check_count(model_samples, "model_samples", 2)
    if alpha is not None:
        as_alpha(alpha, None)
    elif calibration_scores is None and z.size < 2:
        raise InvalidInputError("with n = 1 and no calibration_scores, alpha cannot be estimated: pass alpha= or "
                                "calibration_scores=")
    rng = as_rng(seed)
    model_mean, model_var = model_moments(generator, model_samples, rng)  # refuses an empty or failing generator
    estimate = None
    if alpha is None:
        estimate = estimate_alpha(z if calibration_scores is None else calibration_scores, model_mean, margin,
                                  alpha_bounds)
        alpha = estimate.alpha
    alpha = float(alpha)
    current = float(predictive_mean(z, alpha, model_mean))
    lam = alpha / (z.size + alpha)
    half = float(stats.norm.ppf(hi_p)) * lam * math.sqrt(model_var / model_samples)
    d = posterior_draws(z, generator, alpha, method=method, variant=variant, draws=draws, horizon=horizon, seed=rng)
    low, high = np.quantile(d, [lo_p, hi_p])
    return MetricUncertainty(int(z.size), float(level), method, variant if method == "dirichlet" else None, alpha,
                             estimate, model_mean, model_samples, current, (current - half, current + half),
                             (float(low), float(high)), d)
