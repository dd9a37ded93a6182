"""Forecast-first uncertainty for a deployed rule's metric from n real scores and a frozen generator: the Dirichlet
predictive rule, its martingale posterior (forward resampling and the Dirichlet-mean shortcut), the small-n minimax
choice of alpha, and the bootstrap / Bayesian bootstrap / jackknife baselines (Ruiz-Mazo & Garg, ICLR 2026).

    from rankwise.algorithms.martingale_posterior import PoolGenerator, martingale_posterior
    gen = PoolGenerator(model_scores)                       # or any generator(size, rng) -> [size] scores
    res = martingale_posterior(scores, gen, calibration_scores=cal, level=0.9)
    res.current, res.long_run, res.alpha
"""

from rankwise.algorithms.martingale_posterior.alpha import (
    ALPHA_BOUNDS, AlphaEstimate, estimate_alpha, minimax_alpha, minimax_risk, shrinkage_risk,
)
from rankwise.algorithms.martingale_posterior.api import (
    METHODS, MetricUncertainty, martingale_posterior, posterior_draws,
)
from rankwise.algorithms.martingale_posterior.baselines import (
    bayesian_bootstrap_interval, bootstrap_draws, bootstrap_interval, jackknife_interval,
)
from rankwise.algorithms.martingale_posterior.dirichlet import VARIANTS, dirichlet_shortcut, dp_mean_draws, sticks_for
from rankwise.algorithms.martingale_posterior.forward import forward_resample
from rankwise.algorithms.martingale_posterior.generators import (
    PoolGenerator, ScoredGenerator, ScoreGenerator, draw_scores, model_moments,
)
from rankwise.algorithms.martingale_posterior.schedule import drift_bound, mixing_weight, predictive_mean

__all__ = [
    "martingale_posterior", "posterior_draws", "MetricUncertainty", "METHODS", "forward_resample",
    "dirichlet_shortcut", "dp_mean_draws", "sticks_for", "VARIANTS", "estimate_alpha", "AlphaEstimate",
    "minimax_alpha", "minimax_risk", "shrinkage_risk", "ALPHA_BOUNDS", "mixing_weight", "predictive_mean",
    "drift_bound", "bootstrap_interval", "bayesian_bootstrap_interval", "jackknife_interval", "bootstrap_draws",
    "PoolGenerator", "ScoredGenerator", "ScoreGenerator", "draw_scores", "model_moments",
]
