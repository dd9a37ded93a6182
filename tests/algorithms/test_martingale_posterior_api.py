"""Martingale-posterior UQ: the public API (intervals for the current and the long-run metric), the baselines, and
bad input (n = 0, non-finite scores, a generator that returns nothing or fails)."""

import math

import numpy as np
import pytest
from scipy import stats

from rankwise.algorithms.martingale_posterior import (
    PoolGenerator, ScoredGenerator, bootstrap_interval, dirichlet_shortcut, estimate_alpha, forward_resample,
    jackknife_interval, martingale_posterior, posterior_draws, predictive_mean,
)
from rankwise.errors import InvalidInputError, NumericalError, RankwiseError

pytestmark = pytest.mark.method("martingale-posterior-uq")

RNG = np.random.default_rng(7)
POOL = PoolGenerator(RNG.beta(2.0, 5.0, 50_000))
SCORES = RNG.beta(5.0, 3.0, 20)
CAL = RNG.beta(5.0, 3.0, 150)


def test_result_fields_and_alpha_rule():
    res = martingale_posterior(SCORES, POOL, calibration_scores=CAL, seed=0)
    assert res.n == 20 and res.method == "dirichlet" and res.variant == "dp_mean" and res.draws.shape == (1000,)
    expected_alpha = estimate_alpha(CAL, res.model_mean).alpha
    assert res.alpha == expected_alpha == res.alpha_estimate.alpha
    assert res.current == pytest.approx(predictive_mean(SCORES, res.alpha, res.model_mean), rel=1e-12)
    lo, hi = res.current_interval
    lam = res.alpha / (20 + res.alpha)
    half = stats.norm.ppf(0.95) * lam * math.sqrt(POOL.variance / res.model_samples)
    assert lo < res.current < hi and (hi - lo) / 2 == pytest.approx(half, rel=0.3)  # model_samples = 200 draws
    assert res.long_run[0] < res.current < res.long_run[1]
    np.testing.assert_allclose(res.long_run, np.quantile(res.draws, [0.05, 0.95]), rtol=0, atol=0)
    assert res.width > 0


def test_alpha_from_the_n_scores_and_given_alpha():
    own = martingale_posterior(SCORES, POOL, seed=1)
    assert own.alpha == estimate_alpha(SCORES, own.model_mean).alpha
    fixed = martingale_posterior(SCORES, POOL, alpha=12.5, seed=1)
    assert fixed.alpha == 12.5 and fixed.alpha_estimate is None


def test_forward_method_and_levels():
    fwd = martingale_posterior(SCORES, POOL, alpha=10.0, method="forward", draws=300, horizon=500, seed=2)
    assert fwd.variant is None and fwd.draws.shape == (300,)
    wide = martingale_posterior(SCORES, POOL, alpha=10.0, level=0.99, seed=3)
    narrow = martingale_posterior(SCORES, POOL, alpha=10.0, level=0.5, seed=3)
    assert narrow.width < wide.width


def test_posterior_draws_dispatch():
    a = posterior_draws(SCORES, POOL, 5.0, draws=50, seed=4)
    np.testing.assert_array_equal(a, dirichlet_shortcut(SCORES, POOL, 5.0, draws=50, seed=4))
    b = posterior_draws(SCORES, POOL, 5.0, method="forward", draws=20, horizon=30, seed=5)
    np.testing.assert_array_equal(b, forward_resample(SCORES, POOL, 5.0, draws=20, horizon=30, seed=5))


def test_scored_generator_composes_sampler_and_score():
    gen = ScoredGenerator(lambda k, rng: rng.normal(size=(k, 2)), lambda x: (x[:, 1] > 0).astype(float))
    res = martingale_posterior(np.array([1.0, 0.0, 1.0, 1.0]), gen, alpha=5.0, seed=6)
    assert 0.0 <= res.long_run[0] <= res.long_run[1] <= 1.0
    assert abs(res.model_mean - 0.5) < 0.15


def test_baselines():
    lo, hi = jackknife_interval(SCORES, 0.9)
    t_lo, t_hi = stats.t.interval(0.9, SCORES.size - 1, loc=SCORES.mean(), scale=stats.sem(SCORES))
    # pseudo-values n theta - (n - 1) theta_(-i) cancel terms of size n max|score|: a few roundings of that size
    eps = 16 * SCORES.size * np.finfo(float).eps * np.abs(SCORES).max()
    assert abs(lo - t_lo) < eps and abs(hi - t_hi) < eps  # for the mean the jackknife is the t interval
    b_lo, b_hi = bootstrap_interval(SCORES, 0.9, draws=2000, seed=0)
    assert SCORES.min() <= b_lo < SCORES.mean() < b_hi <= SCORES.max()


# ---- bad input --------------------------------------------------------------------------------------------------


def test_no_scores():
    for empty in ([], np.empty(0), np.empty((3, 0))):
        with pytest.raises(InvalidInputError, match="n = 0"):
            martingale_posterior(empty, POOL, alpha=5.0)
    with pytest.raises(InvalidInputError, match="n = 0"):
        dirichlet_shortcut([], POOL, 5.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_scores(bad):
    s = SCORES.copy()
    s[3] = bad
    with pytest.raises(NumericalError, match="non-finite"):
        martingale_posterior(s, POOL, alpha=5.0)
    c = CAL.copy()
    c[0] = bad
    with pytest.raises(NumericalError, match="non-finite"):
        martingale_posterior(SCORES, POOL, calibration_scores=c)


@pytest.mark.parametrize("gen, match", [
    (lambda k, rng: np.empty(0), "no scores"),
    (lambda k, rng: None, "None"),
    (lambda k, rng: [], "no scores"),
    (lambda k, rng: np.zeros(max(1, k - 1)), "returned"),
    (lambda k, rng: "abc", "not numbers"),
])
def test_generator_that_returns_nothing_or_the_wrong_thing(gen, match):
    with pytest.raises(InvalidInputError, match=match):
        martingale_posterior(SCORES, gen, alpha=5.0)


def test_generator_that_raises_or_returns_nan():
    def broken(k, rng):
        raise RuntimeError("sampler crashed")

    with pytest.raises(InvalidInputError, match="sampler crashed"):
        martingale_posterior(SCORES, broken, alpha=5.0)
    with pytest.raises(NumericalError):
        martingale_posterior(SCORES, lambda k, rng: np.full(k, np.nan), alpha=5.0)


def test_other_bad_arguments():
    with pytest.raises(InvalidInputError, match="alpha cannot be estimated"):
        martingale_posterior([0.5], POOL)
    assert isinstance(martingale_posterior([0.5], POOL, alpha=5.0).long_run, tuple)  # n = 1 with alpha is fine
    for kwargs in ({"alpha": -1.0}, {"alpha": math.nan}, {"level": 1.0}, {"level": 0}, {"method": "mcmc"},
                   {"variant": "dp"}, {"draws": 0}, {"horizon": -1}, {"model_samples": 1}):
        with pytest.raises(InvalidInputError):
            martingale_posterior(SCORES, POOL, **({"alpha": 5.0} | kwargs))
    with pytest.raises(InvalidInputError, match="one data set"):
        martingale_posterior(np.ones((2, 5)), POOL, alpha=5.0)
    with pytest.raises(InvalidInputError, match="n >= 2"):
        jackknife_interval([1.0])
    with pytest.raises(InvalidInputError):
        estimate_alpha([1.0], 0.0)
    with pytest.raises(InvalidInputError, match="shape"):
        forward_resample(np.ones((3, 4)), POOL, [1.0, 2.0])
    with pytest.raises(RankwiseError):
        PoolGenerator([])
