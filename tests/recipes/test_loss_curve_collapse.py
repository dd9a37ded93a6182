"""Loss-curve collapse: the card's invariants (l(1) = 1, tau = 1/(eta lambda T), the divisor recovers a scaled
reference, causal smoothing) and refusals of bad input."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from rankwise.errors import InvalidInputError, NumericalError, RankwiseError
from rankwise.recipes.loss_curve_collapse import (
    Curve, collapse_spread, ema_smooth, first_alarm, fit_divisor, fit_divisor_arrays, grid, normalise,
    reference_curve, residual, rise_alarm, timescale, timescale_adamw, timescale_in_steps, timescale_param_groups,
    weight_decay_for_timescale,
)

pytestmark = pytest.mark.method("loss-curve-collapse")

EPS = np.finfo(np.float64).eps


def _curve(n=200, scale=3.0, seed=None, noise=0.0):
    t = np.arange(1, n + 1) / n
    shape = 1.0 + 0.8 * np.exp(-5 * t) + 0.1 * (1 - t)  # falling, like a loss curve
    y = scale * shape / shape[-1]
    if seed is not None:
        y = y * (1 + noise * np.random.default_rng(seed).standard_normal(n))
    return Curve(t, y)


def test_normalised_curve_ends_at_one():
    for scale in (0.5, 2.7, 1e3):
        c = normalise(_curve(scale=scale, seed=1, noise=0.01))
        assert c.final == 1.0
    c = _curve()
    off = normalise(c, offset=0.5)
    assert off.final == 1.0
    np.testing.assert_allclose(off.loss, (c.loss - 0.5) / (c.final - 0.5), rtol=4 * EPS)


def test_timescale_equals_one_over_eta_lambda_T():
    b, eta, lam, steps = 2048, 3e-3, 0.7, 500
    tau = timescale(b, eta, lam, b * steps)
    assert tau == pytest.approx(1 / (eta * lam * steps), rel=4 * EPS)
    assert timescale_in_steps(eta, lam, steps) == pytest.approx(tau, rel=4 * EPS)
    assert weight_decay_for_timescale(tau, eta, steps) == pytest.approx(lam, rel=8 * EPS)


def test_divisor_recovers_a_scaled_copy_exactly_and_within_one_percent_under_noise():
    ref = normalise(_curve())
    for c in (0.9, 2.5, 40.0):
        scaled = Curve(ref.t_hat, c * ref.loss)
        assert fit_divisor(scaled, ref, upto=0.3) == pytest.approx(c, rel=16 * EPS)
    for seed in range(5):
        noisy = Curve(ref.t_hat, 2.5 * ref.loss * (1 + 0.01 * np.random.default_rng(seed).standard_normal(ref.t_hat.size)))
        assert abs(fit_divisor(noisy, ref, upto=0.3) / 2.5 - 1) < 0.01


def test_divisor_uses_only_the_prefix():
    ref = normalise(_curve())
    later = ref.loss.copy()
    later[ref.t_hat > 0.3] *= 5  # whatever happens after the prefix is not seen
    assert fit_divisor(Curve(ref.t_hat, 2 * later), ref, upto=0.3) == pytest.approx(2.0, rel=16 * EPS)


def test_ema_is_causal_and_keeps_constants():
    c = _curve(seed=0, noise=0.05)
    s = ema_smooth(c, 0.05)
    changed = c.loss.copy()
    changed[120:] += 10.0
    s2 = ema_smooth(Curve(c.t_hat, changed), 0.05)
    np.testing.assert_array_equal(s.loss[:120], s2.loss[:120])
    assert not np.allclose(s.loss[120:], s2.loss[120:])
    const = ema_smooth(Curve(c.t_hat, np.full(c.t_hat.size, 2.0)), 0.05)
    np.testing.assert_allclose(const.loss, 2.0, rtol=64 * EPS)  # bias-corrected: no pull towards 0


def test_ema_window_is_measured_in_t_hat():
    # the same underlying curve sampled at 100 and 400 steps smooths to the same curve (up to discretisation)
    f = lambda t: 1 + np.exp(-6 * t)  # noqa: E731
    short = Curve(np.arange(1, 101) / 100, f(np.arange(1, 101) / 100))
    long = Curve(np.arange(1, 401) / 400, f(np.arange(1, 401) / 400))
    g = np.linspace(0.2, 1, 9)
    # discretisation: the coarse run's points are dt = 0.01 apart, so the two differ by at most ~ dt * max|f'|
    # (0.018 on t >= 0.2); a window counted in steps would lag 4x less in the long run, ~ 0.05 * max|f'| apart
    atol = 0.01 * 6 * np.exp(-6 * 0.2)
    np.testing.assert_allclose(ema_smooth(short, 0.05).at(g), ema_smooth(long, 0.05).at(g), rtol=0, atol=atol)
    assert np.abs(ema_smooth(short, 0.05).at(g) - ema_smooth(long, 0.2).at(g)).max() > 3 * atol


def test_spread_is_zero_for_collapsed_curves_and_positive_otherwise():
    ref = normalise(_curve())
    coarse = Curve(grid(50), ref.at(grid(50)))  # a different length, same curve
    assert collapse_spread([ref, coarse]) < 1e-3
    stretched = normalise(Curve(ref.t_hat, _curve().at(np.sqrt(ref.t_hat))))
    assert collapse_spread([ref, stretched]) > 1e-2
    r = reference_curve([ref, coarse], grid(100))
    assert r.loss.shape == (100,)


def test_residual_and_alarms():
    ref = normalise(_curve())
    clean = Curve(ref.t_hat, 2.0 * ref.loss)
    rho = residual(clean, ref, 2.0)
    assert np.abs(rho.loss).max() < 1e-12
    assert first_alarm(rho, 0.01) is None
    faulty = clean.loss.copy()
    faulty[ref.t_hat >= 0.5] *= 1.05
    rho = residual(Curve(ref.t_hat, faulty), ref, 2.0)
    assert first_alarm(rho, 0.01) == pytest.approx(0.5)
    assert first_alarm(rho, 0.01, lo=0.6) == pytest.approx(0.6)
    assert rise_alarm(Curve(ref.t_hat, faulty), 0.01) == pytest.approx(0.5)
    assert rise_alarm(clean, 0.01) is None  # a falling curve never rises


def test_param_groups_share_tau_or_lambda():
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.LayerNorm(8))
    ratio = lambda name, p: 0.5 if name.startswith("1.") else 1.0  # noqa: E731
    groups = timescale_param_groups(model, 1e-2, 100, tau=0.2, lr_ratio=ratio)
    decayed = [g for g in groups if g["weight_decay"] > 0]
    assert {len(g["params"]) for g in groups} and len(decayed) == 2
    for g in decayed:
        assert timescale_in_steps(g["lr"], g["weight_decay"], 100) == pytest.approx(0.2, rel=8 * EPS)
    assert all(g["tau"] == math.inf for g in groups if g["weight_decay"] == 0)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    fixed = timescale_param_groups(model, 1e-2, 100, weight_decay=0.3, lr_ratio=ratio)
    taus = sorted(g["tau"] for g in fixed if g["weight_decay"] > 0)
    assert taus[1] == pytest.approx(2 * taus[0], rel=8 * EPS)  # half the lr: twice the timescale


def test_factory_builds_adamw_from_the_config():
    model = nn.Linear(4, 4)
    config = type("C", (), {"lr": 1e-2, "steps": 50})()
    opt = timescale_adamw(tau=0.5)(model, config)
    assert isinstance(opt, torch.optim.AdamW)
    g = next(g for g in opt.param_groups if g["weight_decay"] > 0)
    assert g["weight_decay"] == pytest.approx(1 / (1e-2 * 0.5 * 50), rel=8 * EPS)
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)


# ---- bad input -------------------------------------------------------------------------------------------------

def test_curves_of_different_lengths_are_refused_where_compared_point_by_point():
    with pytest.raises(InvalidInputError, match="different lengths"):
        fit_divisor_arrays([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(InvalidInputError, match="different lengths"):
        Curve(np.array([0.5, 1.0]), np.array([1.0, 2.0, 3.0]))
    with pytest.raises(InvalidInputError, match="different lengths"):
        Curve.from_steps([3.0, 2.0, 1.0], tokens=[10, 20])


@pytest.mark.parametrize("bad", [[1.0, float("nan"), 2.0], [1.0, float("inf"), 2.0]])
def test_non_finite_losses_are_refused(bad):
    with pytest.raises(NumericalError, match="non-finite"):
        Curve.from_steps(bad)
    with pytest.raises(NumericalError):
        fit_divisor_arrays(bad, [1.0, 1.0, 1.0])


@pytest.mark.parametrize("call", [
    lambda: timescale(2048, 1e-3, 0.0, 1e6),
    lambda: timescale_in_steps(1e-3, 0.0, 100),
    lambda: weight_decay_for_timescale(0.0, 1e-3, 100),
    lambda: timescale(2048, -1e-3, 0.1, 1e6),
    lambda: timescale(2048, 1e-3, 0.1, 100),  # fewer tokens than one batch
    lambda: timescale_adamw(weight_decay=0.0),
    lambda: timescale_adamw(),
    lambda: timescale_adamw(tau=0.2, weight_decay=0.1),
    lambda: timescale_param_groups(nn.Linear(2, 2), 1e-3, 10, weight_decay=float("nan")),
])
def test_zero_lambda_and_other_bad_settings_are_refused(call):
    with pytest.raises(RankwiseError):
        call()


def test_zero_lambda_message_says_why():
    with pytest.raises(InvalidInputError, match="timescale is infinite"):
        timescale(2048, 1e-3, 0.0, 1e6)


@pytest.mark.parametrize("call", [
    lambda: Curve(np.array([0.0, 1.0]), np.array([1.0, 1.0])),  # t_hat must be > 0
    lambda: Curve(np.array([0.6, 0.5]), np.array([1.0, 1.0])),  # increasing
    lambda: Curve.from_steps([1.0]),  # one point is no curve
    lambda: ema_smooth(_curve(), 0.0),
    lambda: normalise(_curve(), offset=10.0),
    lambda: collapse_spread([_curve()]),
    lambda: fit_divisor(_curve(), _curve(), upto=0.0),
    lambda: residual(_curve(), _curve(), 0.0),
    lambda: first_alarm(_curve(), -1.0),
])
def test_bad_curves_and_arguments_are_refused(call):
    with pytest.raises(RankwiseError):
        call()
