"""Martingale-posterior UQ: the card's invariants (schedule, martingale property, forward = shortcut in the limit,
the alpha limits, the minimax alpha, the drift bound, the range of the draws)."""

import math

import numpy as np
import pytest
from scipy import stats

from rankwise.algorithms.martingale_posterior import (
    PoolGenerator, bayesian_bootstrap_interval, bootstrap_draws, dirichlet_shortcut, dp_mean_draws, drift_bound,
    estimate_alpha, forward_resample, minimax_alpha, minimax_risk, mixing_weight, predictive_mean, shrinkage_risk,
    sticks_for,
)

pytestmark = pytest.mark.method("martingale-posterior-uq")

EPS = np.finfo(np.float64).eps
RNG = np.random.default_rng(12345)
POOL = PoolGenerator(RNG.beta(2.0, 5.0, 200_000))  # theta(Q) ~ 0.286, bounded in [0, 1]
DATA = RNG.beta(5.0, 3.0, 12)  # zbar ~ 0.6: a clear mismatch with the generator


def test_mixing_weight_schedule():
    i = np.arange(0, 50)
    np.testing.assert_allclose(mixing_weight(i, 7.0), 7.0 / (i + 7.0), rtol=0, atol=0)
    assert np.all(mixing_weight(i, 0.0) == 0.0)
    assert mixing_weight(10, 1e12) > 1 - 1e-10  # -> 1 as alpha -> inf
    assert np.all(np.diff(mixing_weight(i, 3.0)) < 0)  # the generator's weight decays with data


def test_martingale_property_one_and_many_steps():
    """E[theta(P_{n+k}) | F_n] = theta(P_n), within 3 Monte-Carlo standard errors, for k = 1 and k = 40."""
    alpha, n = 6.0, DATA.size
    theta_q = POOL.mean
    now = predictive_mean(DATA, alpha, theta_q)
    for k in (1, 40):
        path = forward_resample(DATA, POOL, alpha, draws=40_000, horizon=k, seed=k, trajectory=True)
        t = n + k
        later = (t * path[:, -1] + alpha * theta_q) / (t + alpha)
        se = later.std(ddof=1) / math.sqrt(later.size)
        assert abs(later.mean() - now) < 3 * se, (k, later.mean(), now, se)


def test_forward_with_large_horizon_matches_dp_mean_shortcut():
    alpha = 5.0
    fwd = forward_resample(DATA, POOL, alpha, draws=2000, horizon=4000, seed=1)
    dws = dirichlet_shortcut(DATA, POOL, alpha, draws=2000, variant="dp_mean", seed=2)
    assert stats.ks_2samp(fwd, dws).pvalue > 0.01
    expected = (DATA.sum() + alpha * POOL.mean) / (DATA.size + alpha)
    for d in (fwd, dws):
        assert abs(d.mean() - expected) < 4 * d.std(ddof=1) / math.sqrt(d.size)


def test_single_variant_is_over_dispersed_by_the_dp_factor():
    """Var(single) - Var(dp_mean) = E[w_0^2] Var_Q(h) alpha / (alpha + 1), w_0 ~ Beta(alpha, n)."""
    alpha, n = 8.0, DATA.size
    single = dirichlet_shortcut(DATA, POOL, alpha, draws=40_000, variant="single", seed=3)
    dp = dirichlet_shortcut(DATA, POOL, alpha, draws=40_000, variant="dp_mean", seed=4)
    e_w0_sq = alpha * (alpha + 1) / ((alpha + n) * (alpha + n + 1))
    expected = e_w0_sq * POOL.variance * alpha / (alpha + 1)
    # sd of a sample variance ~ var * sqrt(2 / B) for near-normal draws; x2 for the skewed single variant
    tol = 4 * 2 * math.sqrt(2 / 40_000) * (single.var() + dp.var())
    assert abs(single.var() - dp.var() - expected) < tol


def test_dp_mean_variance_and_truncation():
    for alpha in (0.5, 10.0, 150.0):
        d = dp_mean_draws(POOL, alpha, 20_000, seed=5)
        exact = POOL.variance / (alpha + 1)
        # truncation may add at most 1%; the rest is Monte-Carlo error of a variance (heavier-tailed at small alpha)
        assert abs(d.var() / exact - 1) < 0.01 + 5 * math.sqrt(2 / d.size) * (3 if alpha < 1 else 1), alpha
        assert abs(d.mean() - POOL.mean) < 4 * math.sqrt(exact / d.size)
    ks = [sticks_for(a) for a in (1.0, 5.0, 50.0, 200.0)]
    assert ks == sorted(ks) and ks[-1] > 200  # the card's 200 atoms would be too few at alpha = 200
    a = 50.0
    k = ks[2]
    assert a * (a / (a + 2)) ** k <= 0.01 < a * (a / (a + 2)) ** (k - 1)


def test_alpha_zero_is_the_bayesian_bootstrap():
    dws = dirichlet_shortcut(DATA, POOL, 0.0, draws=4000, seed=6)
    bb = bootstrap_draws(DATA, draws=4000, bayesian=True, seed=7)
    assert stats.ks_2samp(dws, bb).pvalue > 0.01
    fwd = forward_resample(DATA, POOL, 0.0, draws=300, horizon=300, seed=8)
    assert fwd.min() >= DATA.min() and fwd.max() <= DATA.max()  # no generator draw ever enters


def test_alpha_to_infinity_collapses_to_theta_q():
    d = dirichlet_shortcut(DATA, POOL, 1e4, draws=50, seed=9)
    assert abs(d.mean() - POOL.mean) < 0.005
    assert d.std() < 0.01 * np.sqrt(POOL.variance) * 10  # ~ sd_Q / sqrt(alpha) = 0.016 sd_Q


def test_minimax_alpha_minimises_worst_case_risk():
    sigma2, delta, n = 0.09, 0.12, 15
    a = sigma2 / n
    grid = np.linspace(0, 1, 100_001)
    risk = shrinkage_risk(grid, a, delta)
    lam_star = a / (a + delta**2)
    step = grid[1] - grid[0]
    assert abs(grid[risk.argmin()] - lam_star) <= step
    # the risk is (a + delta^2) (lam - lam*)^2 above its minimum: the grid point within step / 2 of lam* is at most
    # (a + delta^2) (step / 2)^2 above it (~5e-13 here), plus the float64 rounding of the risk itself
    grid_gap = (a + delta**2) * (step / 2) ** 2
    assert abs(risk.min() - minimax_risk(a, delta)) <= grid_gap + 16 * EPS * minimax_risk(a, delta)
    alpha_star = minimax_alpha(sigma2, delta)
    assert alpha_star == pytest.approx(sigma2 / delta**2, rel=4 * EPS)  # the same two float64 operations
    assert mixing_weight(n, alpha_star) == pytest.approx(lam_star, rel=1e-12)  # lambda_n at alpha* is lambda*


def test_estimate_alpha_formula_and_clipping():
    cal = RNG.normal(0.5, 0.3, 150)
    est = estimate_alpha(cal, model_mean=0.44)
    sigma2 = cal.var(ddof=1)
    delta = abs(0.44 - cal.mean()) + math.sqrt(sigma2 / cal.size)
    assert est.raw == pytest.approx(sigma2 / delta**2, rel=1e-12)
    assert est.alpha == min(max(est.raw, 5.0), 200.0)
    assert estimate_alpha(cal, model_mean=10.0).alpha == 5.0  # far-off generator: the lower bound
    assert estimate_alpha(cal, model_mean=10.0).clipped == "low"
    matched = estimate_alpha(cal, model_mean=float(cal.mean()), margin=0.0)
    assert matched.alpha == 200.0 and matched.clipped == "high"  # Delta-hat = 0
    for m in RNG.normal(0.5, 0.5, 50):
        assert 5.0 <= estimate_alpha(cal, model_mean=float(m)).alpha <= 200.0


def test_drift_bound_holds_on_simulated_paths():
    alpha, n, delta, horizon = 4.0, DATA.size, 0.1, 600
    paths = forward_resample(DATA, POOL, alpha, draws=2000, horizon=horizon, seed=10, trajectory=True)
    t = np.arange(n, n + horizon + 1)
    forecasts = (t * paths + alpha * POOL.mean) / (t + alpha)  # theta(P_t) along each path
    drift = np.abs(forecasts - forecasts[:, :1]).max(1)
    bound = drift_bound(n, alpha, 1.0, delta)  # scores in [0, 1]
    assert np.mean(drift <= bound) >= 1 - delta
    # the path starts at the data: a cumulative sum of the 12 scores / 12 vs numpy's pairwise mean, each within
    # (n - 1) u max|score| of the exact mean
    np.testing.assert_allclose(paths[:, 0], DATA.mean(), rtol=0, atol=DATA.size * EPS * np.abs(DATA).max())


def test_all_draws_lie_in_the_score_range():
    lo, hi = min(DATA.min(), POOL.pool.min()), max(DATA.max(), POOL.pool.max())
    batch = np.stack([DATA, DATA[::-1], RNG.beta(1, 1, DATA.size)])
    draws = [forward_resample(batch, POOL, [0.0, 5.0, 200.0], draws=50, horizon=200, seed=11),
             dirichlet_shortcut(batch, POOL, [0.0, 5.0, 200.0], draws=200, seed=12),
             dirichlet_shortcut(batch, POOL, [0.0, 5.0, 200.0], draws=200, variant="single", seed=13),
             bootstrap_draws(batch, draws=200, seed=14), bootstrap_draws(batch, draws=200, bayesian=True, seed=15)]
    for d in draws:
        assert d.shape[0] == 3 and np.all(d >= min(lo, batch.min())) and np.all(d <= max(hi, batch.max()))


def test_batched_calls_match_shapes_and_per_set_alpha():
    batch = np.stack([DATA, DATA + 0.1])
    assert forward_resample(batch, POOL, [1.0, 2.0], draws=7, horizon=5, seed=0).shape == (2, 7)
    assert forward_resample(batch, POOL, 1.0, draws=7, horizon=5, seed=0, trajectory=True).shape == (2, 7, 6)
    d = dirichlet_shortcut(batch, POOL, [0.0, 1e3], draws=2000, seed=1)
    assert d.shape == (2, 2000)
    assert abs(d[0].mean() - DATA.mean()) < 0.01 and abs(d[1].mean() - predictive_mean(batch[1], 1e3, POOL.mean)) < 0.01
    lo, hi = bayesian_bootstrap_interval(batch, 0.9, draws=500, seed=2)
    assert lo.shape == hi.shape == (2,) and np.all(lo < hi)


def test_same_seed_same_draws():
    a = dirichlet_shortcut(DATA, POOL, 5.0, draws=100, seed=3)
    b = dirichlet_shortcut(DATA, POOL, 5.0, draws=100, seed=3)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(forward_resample(DATA, POOL, 5.0, draws=10, horizon=50, seed=4),
                                  forward_resample(DATA, POOL, 5.0, draws=10, horizon=50, seed=4))
