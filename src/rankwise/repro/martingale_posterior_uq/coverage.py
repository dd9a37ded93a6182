"""The coverage study both reproductions share: R repetitions of "observe n real scores, build each method's 90%
interval, check whether it contains the target", for two targets:

- pred: theta_inf under the deployed forecasting rule, one independent forward run per repetition (horizon
  `target_horizon`, the card's protocol); it is drawn from the same urn the martingale-posterior intervals describe,
  so it measures calibration to the forecasting rule, not to the population;
- true: theta(F*), the population value, known exactly in the synthetic world and as a pool mean in the LLM one.

Everything is batched over the R repetitions ([R, n] score arrays).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from rankwise.algorithms.martingale_posterior import (
    bayesian_bootstrap_interval, bootstrap_interval, dirichlet_shortcut, draw_scores, estimate_alpha,
    forward_resample, jackknife_interval,
)
from rankwise.algorithms.martingale_posterior.generators import ScoreGenerator
from rankwise.core.progress import say

LEVEL = 0.9
MP_FORWARD = "MP forward"
DWS = "DWS dp_mean"
DWS_SINGLE = "DWS single"
DWS_SELF = "DWS dp_mean, alpha from the n"
NPB = "bootstrap"
BB = "Bayesian bootstrap"
JACKKNIFE = "jackknife"
METHODS = (MP_FORWARD, DWS, DWS_SINGLE, DWS_SELF, NPB, BB, JACKKNIFE)
MP_METHODS = (MP_FORWARD, DWS, DWS_SINGLE, DWS_SELF)


@dataclass(frozen=True)
class StudySettings:
    repetitions: int
    ns: tuple[int, ...]
    calibration_n: int  # held-out real scores for alpha-hat (the authors' code: 150)
    model_samples: int  # generator draws for theta-hat(Q) in alpha-hat (the authors' code: 200)
    forward_draws: int
    forward_horizon: int
    dws_draws: int
    bootstrap_draws: int
    target_horizon: int
    forward_ns: tuple[int, ...]  # the n at which forward resampling runs (it is the slow method)


@dataclass
class NResult:
    """One n: per method, per repetition, whether each target was covered, and the interval width."""

    n: int
    pred: dict[str, np.ndarray] = field(default_factory=dict)
    true: dict[str, np.ndarray] = field(default_factory=dict)
    width: dict[str, np.ndarray] = field(default_factory=dict)
    alpha_cal: np.ndarray | None = None
    alpha_self: np.ndarray | None = None
    draw_range_violations: int = 0


def _alphas(cal: np.ndarray, model_means: np.ndarray) -> np.ndarray:
    return np.array([estimate_alpha(c, float(m)).alpha for c, m in zip(cal, model_means)])


def run_study(draw_real: Callable[[np.random.Generator, int, int], np.ndarray], generator: ScoreGenerator,
              theta_true: float, s: StudySettings, rng: np.random.Generator, label: str,
              support: tuple[float, float]) -> dict[int, NResult]:
    """draw_real(rng, R, n) -> [R, n] i.i.d. real scores; `support` = (min, max) of every score (data and model)."""
    out: dict[int, NResult] = {}
    r = s.repetitions
    lo_p, hi_p = (1 - LEVEL) / 2, (1 + LEVEL) / 2
    for n in s.ns:
        say(f"{label}: n = {n}, {r} repetitions")
        res = NResult(n)
        z = draw_real(rng, r, n)
        cal = draw_real(rng, r, s.calibration_n)
        model_means = draw_scores(generator, r * s.model_samples, rng).reshape(r, s.model_samples).mean(1)
        res.alpha_cal = _alphas(cal, model_means)
        res.alpha_self = _alphas(z, model_means)
        # One independent forward run per repetition: the predictive target, for each alpha rule in use.
        target = {a_name: forward_resample(z, generator, a, draws=1, horizon=s.target_horizon, seed=rng)[:, 0]
                  for a_name, a in (("cal", res.alpha_cal), ("self", res.alpha_self))}
        intervals: dict[str, tuple[np.ndarray, np.ndarray, str]] = {}

        def from_draws(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            res.draw_range_violations += int(np.sum((d < support[0] - 1e-12) | (d > support[1] + 1e-12)))
            q = np.quantile(d, [lo_p, hi_p], axis=1)
            return q[0], q[1]

        if n in s.forward_ns:
            intervals[MP_FORWARD] = (*from_draws(forward_resample(z, generator, res.alpha_cal, draws=s.forward_draws,
                                                                  horizon=s.forward_horizon, seed=rng)), "cal")
        intervals[DWS] = (*from_draws(dirichlet_shortcut(z, generator, res.alpha_cal, draws=s.dws_draws, seed=rng)),
                          "cal")
        intervals[DWS_SINGLE] = (*from_draws(dirichlet_shortcut(z, generator, res.alpha_cal, draws=s.dws_draws,
                                                                variant="single", seed=rng)), "cal")
        intervals[DWS_SELF] = (*from_draws(dirichlet_shortcut(z, generator, res.alpha_self, draws=s.dws_draws,
                                                              seed=rng)), "self")
        # The baselines have no alpha; their predictive target is the deployed rule's (alpha-hat from calibration).
        intervals[NPB] = (*bootstrap_interval(z, LEVEL, draws=s.bootstrap_draws, seed=rng), "cal")
        intervals[BB] = (*bayesian_bootstrap_interval(z, LEVEL, draws=s.bootstrap_draws, seed=rng), "cal")
        intervals[JACKKNIFE] = (*jackknife_interval(z, LEVEL), "cal")
        for m, (low, high, a_name) in intervals.items():
            res.pred[m] = (low <= target[a_name]) & (target[a_name] <= high)
            res.true[m] = (low <= theta_true) & (theta_true <= high)
            res.width[m] = high - low
        out[n] = res
    return out


def wilson(covered: np.ndarray) -> tuple[float, float, float]:
    """(proportion, low, high): the Wilson 95% interval of a coverage proportion over repetitions."""
    k, total = int(np.sum(covered)), int(np.size(covered))
    ci = stats.binomtest(k, total).proportion_ci(confidence_level=0.95, method="wilson")
    return k / total, float(ci.low), float(ci.high)


def pooled_small_n(results: dict[int, NResult], method: str, target: str, max_n: int = 20) -> np.ndarray:
    """Per repetition, the coverage averaged over the n <= max_n (independent data per n): [R] values in [0, 1]."""
    rows = [getattr(results[n], target)[method].astype(float) for n in sorted(results) if n <= max_n
            and method in getattr(results[n], target)]
    return np.mean(rows, axis=0)


def add_tables(report, results: dict[int, NResult], label: str) -> None:
    """Coverage (both targets, Wilson 95% intervals) and mean width per method and n."""
    t = report.table(f"{label}: coverage of nominal {LEVEL:.0%} intervals over repetitions (Wilson 95% intervals)",
                     ["n", "method", "coverage_theta_inf", "ci_theta_inf", "coverage_theta_true", "ci_theta_true",
                      "mean_width", "repetitions"])
    for n, res in results.items():
        for m in METHODS:
            if m not in res.pred:
                continue
            p, plo, phi = wilson(res.pred[m])
            q, qlo, qhi = wilson(res.true[m])
            t.add(n=n, method=m, coverage_theta_inf=p, ci_theta_inf=f"[{plo:.3f}, {phi:.3f}]", coverage_theta_true=q,
                  ci_theta_true=f"[{qlo:.3f}, {qhi:.3f}]", mean_width=float(res.width[m].mean()),
                  repetitions=int(res.pred[m].size))
    a = report.table(f"{label}: alpha-hat over repetitions (clipped to [5, 200])",
                     ["n", "rule", "median", "q10", "q90", "share_at_5", "share_at_200"])
    for n, res in results.items():
        for rule, v in (("calibration (150 held-out)", res.alpha_cal), ("the n scores", res.alpha_self)):
            a.add(n=n, rule=rule, median=float(np.median(v)), q10=float(np.quantile(v, 0.1)),
                  q90=float(np.quantile(v, 0.9)), share_at_5=float(np.mean(v <= 5)), share_at_200=float(np.mean(v >= 200)))
