"""LA-LoRA's card invariants: the alternation, the DP step, the binomial filter, the accountant."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from rankwise.core.privacy import (clip_per_sample, epsilon_spent, noise_for_epsilon, noisy_mean,
                                            per_sample_gradients)
from rankwise.adapters.la_lora import LocalDPConfig, active_factors, binomial_smooth, local_round, smooth_factor_gradient
from rankwise.errors import InvalidInputError

pytestmark = pytest.mark.method("la-lora")

D_IN, D_OUT, R, C = 10, 3, 2, 4
EPS64 = torch.finfo(torch.float64).eps
# float64 throughout: 1e-12 is ~500 eps64 at the |values| <= ~10 here (measured differences <= 1e-15)
F64_ATOL = 1e-12


def _sum_tol(x: torch.Tensor, terms: int = 5) -> float:
    """Rounding of `terms`-term float64 sums whose inputs are at most max|x|: the binomial filter's 5 taps."""
    return terms * EPS64 * max(float(x.abs().max()), 1.0)


def _setup(seed: int = 0, n: int = 12):
    g = torch.Generator().manual_seed(seed)
    params = {"lora.A": torch.randn(R, D_IN, generator=g, dtype=torch.float64),
              "lora.B": torch.randn(D_OUT, R, generator=g, dtype=torch.float64) * 0.1,
              "head.weight": torch.randn(C, D_OUT, generator=g, dtype=torch.float64)}
    roles = {"lora.A": "A", "lora.B": "B", "head.weight": "other"}
    data = {"x": torch.randn(n, D_IN, generator=g, dtype=torch.float64), "y": torch.randint(0, C, (n,), generator=g)}
    W0 = torch.randn(D_OUT, D_IN, generator=g, dtype=torch.float64)

    def loss(p, sample):
        h = sample["x"] @ W0.T + (sample["x"] @ p["lora.A"].T) @ p["lora.B"].T
        return F.cross_entropy((h @ p["head.weight"].T).reshape(1, -1), sample["y"].reshape(1))

    return params, roles, data, loss


def test_schedules_of_the_four_arms():
    assert [active_factors("la-lora", k, 1) for k in (1, 2, 3)] == [{"B"}, {"A"}, {"B"}]  # per local step, B first
    assert [active_factors("la-lora", k, 1, start_with="A") for k in (1, 2)] == [{"A"}, {"B"}]
    assert [active_factors("rolora", 1, t) for t in (1, 2, 3)] == [{"B"}, {"A"}, {"B"}]  # per round
    assert active_factors("rolora", 1, 1) == active_factors("rolora", 2, 1)
    assert active_factors("ffa-lora", 2, 2) == {"B"} and active_factors("dp-lora", 1, 1) == {"A", "B"}


def test_b_step_leaves_a_bit_identical_and_a_step_leaves_b():
    params, roles, data, loss = _setup()
    cfg = LocalDPConfig(arm="la-lora", local_steps=1, batch_size=4, lr=0.1, clip=1.0)
    after, stats = local_round(loss, params, roles, data, cfg, noise_multiplier=1.0, round_index=1, seed=3)
    assert torch.equal(after["lora.A"], params["lora.A"]) and not torch.equal(after["lora.B"], params["lora.B"])
    assert stats.factor_steps == {"A": 0, "B": 1}
    cfg_a = LocalDPConfig(arm="la-lora", local_steps=1, batch_size=4, lr=0.1, clip=1.0, start_with="A")
    after, _ = local_round(loss, params, roles, data, cfg_a, noise_multiplier=1.0, round_index=1, seed=3)
    assert torch.equal(after["lora.B"], params["lora.B"]) and not torch.equal(after["lora.A"], params["lora.A"])


def test_noiseless_unclipped_unfiltered_b_step_is_plain_sgd():
    params, roles, data, loss = _setup()
    n = data["y"].numel()
    cfg = LocalDPConfig(arm="la-lora", local_steps=1, batch_size=n, lr=0.3, clip=math.inf, smoothing=False)  # q = 1
    after, _ = local_round(loss, params, roles, data, cfg, noise_multiplier=0.0, round_index=1, seed=0)
    p = {k: v.clone().requires_grad_(k != "lora.A") for k, v in params.items()}
    mean = sum(loss(p, {"x": data["x"][j], "y": data["y"][j]}) for j in range(n)) / n
    gB, gH = torch.autograd.grad(mean, [p["lora.B"], p["head.weight"]])
    torch.testing.assert_close(after["lora.B"], params["lora.B"] - 0.3 * gB, rtol=0, atol=F64_ATOL)
    torch.testing.assert_close(after["head.weight"], params["head.weight"] - 0.3 * gH, rtol=0, atol=F64_ATOL)
    assert torch.equal(after["lora.A"], params["lora.A"])


def test_per_sample_gradients_match_a_loop_and_clipping_bounds_every_norm():
    params, roles, data, loss = _setup()
    grads, losses = per_sample_gradients(loss, params, data)
    for j in (0, 5):
        p = {k: v.clone().requires_grad_() for k, v in params.items()}
        lj = loss(p, {"x": data["x"][j], "y": data["y"][j]})
        for (name, t), g in zip(p.items(), torch.autograd.grad(lj, list(p.values()))):
            torch.testing.assert_close(grads[name][j], g, rtol=0, atol=F64_ATOL)
        assert abs(float(losses[j] - lj)) < F64_ATOL
    clipped, norms = clip_per_sample(grads, 0.05)
    assert (norms > 0.05).any()  # the check bites: some gradients were larger than C
    after = torch.linalg.vector_norm(torch.cat([g.reshape(g.size(0), -1) for g in clipped.values()], 1), dim=1)
    # C * n / (n + 1e-6) is below C by ~1e-9 here; recomputing the norm adds only float64 rounding
    assert (after <= 0.05 * (1 + 64 * EPS64)).all()
    small, _ = clip_per_sample(grads, 1e9)
    for name in grads:  # below C nothing changes: the factor clamps to exactly 1
        assert torch.equal(small[name], grads[name]), name


def test_noise_has_std_sigma_c_over_b():
    g = torch.Generator().manual_seed(0)
    zeros = {"w": torch.zeros(4, 50_000, dtype=torch.float64)}  # 4 samples whose clipped gradients are 0
    out = noisy_mean(zeros, clip=2.0, noise_multiplier=1.5, expected_batch=8, generator=g)
    assert abs(float(out["w"].std()) - 1.5 * 2.0 / 8) < 0.01 * 1.5 * 2.0 / 8 * 3


def test_binomial_filter_properties():
    k = torch.tensor([1, 4, 6, 4, 1], dtype=torch.float64) / 16
    assert float(k.sum()) == 1.0
    const = torch.full((3, 9), 2.5, dtype=torch.float64)
    torch.testing.assert_close(binomial_smooth(const, 1), const, rtol=0, atol=_sum_tol(const))
    rank_only = torch.arange(3, dtype=torch.float64)[:, None].expand(3, 9).clone()  # dA varying along the rank axis only
    torch.testing.assert_close(smooth_factor_gradient(rank_only, "A"), rank_only, rtol=0, atol=_sum_tol(rank_only))
    rank_only_b = torch.arange(3, dtype=torch.float64)[None, :].expand(9, 3).clone()  # dB [out, r]
    torch.testing.assert_close(smooth_factor_gradient(rank_only_b, "B"), rank_only_b, rtol=0, atol=_sum_tol(rank_only_b))
    g = torch.randn(4, 7, dtype=torch.float64)
    assert smooth_factor_gradient(g, "A").shape == g.shape and smooth_factor_gradient(g.T, "B").shape == g.T.shape
    assert not torch.allclose(smooth_factor_gradient(g, "A"), g)  # it does filter
    # interior i.i.d. noise: variance shrinks by sum w^2 = 70/256
    noise = torch.randn(200, 4000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ratio = float(binomial_smooth(noise, 1)[:, 2:-2].var() / noise.var())
    assert abs(ratio - 70 / 256) < 0.01
    # an impulse spreads exactly as the kernel, along the feature axis
    e = torch.zeros(1, 9, dtype=torch.float64)
    e[0, 4] = 1
    torch.testing.assert_close(binomial_smooth(e, 1)[0, 2:7], k, rtol=0, atol=_sum_tol(e))


def test_synchronous_noise_has_a_sigma4_cross_term_alternating_none():
    """One noisy local step from B = 0 on a zero-gradient loss, so the step is pure noise N ~ N(0, (sigma C / b)^2):
    DP-LoRA moves both factors, dW = (-N_B)(A - N_A) = -N_B A + N_B N_A, whose noise-product term makes E||dW||^2
    grow as sigma^4 once it dominates (a small A); LA-LoRA's first step moves B alone, dW = -N_B A, exactly sigma^2.
    So doubling sigma multiplies E||dW||^2 by 4 for LA-LoRA and by nearly 16 for DP-LoRA."""
    m, r, n, trials = 6, 3, 8, 300
    A = 1e-3 * torch.randn(r, n, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    params = {"lora.A": A, "lora.B": torch.zeros(m, r, dtype=torch.float64)}
    roles = {"lora.A": "A", "lora.B": "B"}
    data = {"x": torch.randn(4, n, dtype=torch.float64)}

    def loss(p, sample):  # zero gradient: the step is the clipped (zero) gradient's mean plus the noise
        return 0.0 * (p["lora.B"] @ p["lora.A"] @ sample["x"].reshape(-1)).sum()

    def energy(arm: str, sigma: float) -> float:
        cfg = LocalDPConfig(arm=arm, local_steps=1, batch_size=4, lr=1.0, clip=1.0, smoothing=False, deterministic_noise=True)
        total = 0.0
        for t in range(trials):
            new, _ = local_round(loss, params, roles, data, cfg, sigma, 1, seed=t)
            total += float((new["lora.B"] @ new["lora.A"]).pow(2).sum())
        return total / trials

    la = energy("la-lora", 2.0) / energy("la-lora", 1.0)
    dp = energy("dp-lora", 2.0) / energy("dp-lora", 1.0)
    assert abs(la / 4 - 1) < 0.25, la  # sigma^2: the 300-trial means of 48-entry sums are within a few % of theirs
    assert dp > 12, dp  # sigma^4 dominates (|A| = 1e-3 << the noise std sigma / 4)


def test_accountant_reaches_the_target_and_refuses_impossible_ones():
    sigma = noise_for_epsilon(1.0, 1e-5, 0.1, 100)
    eps = epsilon_spent(sigma, 0.1, 100, 1e-5)
    assert 0.98 <= eps <= 1.0
    assert epsilon_spent(sigma * 0.8, 0.1, 100, 1e-5) > 1.0  # less noise spends more
    with pytest.raises(InvalidInputError, match="cannot be reached"):
        noise_for_epsilon(0.01, 1e-5, 0.5, 1000)
    for bad in ((0.0, 1e-5), (-1.0, 1e-5), (1.0, 0.0), (1.0, 1.5)):
        with pytest.raises(InvalidInputError):
            noise_for_epsilon(*bad, 0.1, 10)


def test_bad_local_settings_are_clear_errors_before_any_step():
    params, roles, data, loss = _setup(n=6)
    with pytest.raises(InvalidInputError, match="exceeds this client's 6 examples"):
        local_round(loss, params, roles, data, LocalDPConfig(batch_size=8), 1.0, 1, 0)
    with pytest.raises(InvalidInputError, match="unknown LA-LoRA arm"):
        local_round(loss, params, roles, data, LocalDPConfig(arm="fedsa", batch_size=2), 1.0, 1, 0)
    with pytest.raises(InvalidInputError, match="role"):
        local_round(loss, params, {"lora.A": "A"}, data, LocalDPConfig(batch_size=2), 1.0, 1, 0)
    with pytest.raises(InvalidInputError, match="non-empty"):
        local_round(loss, params, roles, {"x": data["x"][:0], "y": data["y"][:0]}, LocalDPConfig(batch_size=2), 1.0, 1, 0)


def test_local_round_is_a_pure_function_of_its_seed():
    params, roles, data, loss = _setup()
    cfg = LocalDPConfig(arm="dp-lora", local_steps=3, batch_size=4, lr=0.1, optimizer="adamw", deterministic_noise=True)
    a, _ = local_round(loss, params, roles, data, cfg, 1.0, 2, seed=5)
    b, _ = local_round(loss, params, roles, data, cfg, 1.0, 2, seed=5)
    c, _ = local_round(loss, params, roles, data, cfg, 1.0, 2, seed=6)
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["lora.B"], c["lora.B"])


def test_private_noise_cannot_be_regenerated_from_the_seed():
    # the default draws batches and noise from OS entropy: the same seed twice gives two different rounds, neither
    # equal to the deterministic (seed-derived, not private) one
    params, roles, data, loss = _setup()
    private = LocalDPConfig(arm="dp-lora", local_steps=2, batch_size=4, lr=0.1)
    assert private.deterministic_noise is False
    a, _ = local_round(loss, params, roles, data, private, 1.0, 2, seed=5)
    b, _ = local_round(loss, params, roles, data, private, 1.0, 2, seed=5)
    d, _ = local_round(loss, params, roles, data, LocalDPConfig(arm="dp-lora", local_steps=2, batch_size=4, lr=0.1,
                                                               deterministic_noise=True), 1.0, 2, seed=5)
    assert not torch.equal(a["lora.B"], b["lora.B"]) and not torch.equal(a["lora.B"], d["lora.B"])
