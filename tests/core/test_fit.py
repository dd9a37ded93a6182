"""`core.training.fit` (the loop for a loss that is a function of the step) and the schedules it takes."""

import math
from functools import partial

import pytest
import torch
from torch import nn

from rankwise.core.training import fit, lr_at
from rankwise.core.training.schedule import warmup_stable_decay, warmup_times_cosine
from rankwise.errors import InvalidInputError, NumericalError


def _sgd(lr=1.0):
    return lambda params: torch.optim.SGD(params, lr=lr)


def test_warmup_stable_decay_is_warmup_plateau_then_a_line_to_the_floor():
    lrs = [warmup_stable_decay(s, 20, 1.0, 4, 5, 0.1) for s in range(20)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]  # the warmup of lr_at: exact quarters
    assert lrs[4:15] == [1.0] * 11
    # decay step i (1-based) of 5: 1 - i/5 * 0.9; a few roundings of numbers near 1
    assert lrs[15:] == pytest.approx([0.82, 0.64, 0.46, 0.28, 0.1], rel=4 * 2**-52)
    assert lrs[:4] == [lr_at(s, 20, 1.0, 4) for s in range(4)]
    assert [warmup_stable_decay(s, 10, 2.0, 1, 0) for s in range(10)] == [2.0] * 10  # no decay: stays at the peak


def test_warmup_times_cosine_is_the_ramp_times_a_whole_run_cosine_and_equals_lambda_lr_bit_for_bit():
    steps, warmup, peak, floor = 40, 4, 3e-3, 0.1
    lrs = [warmup_times_cosine(s, steps, peak, warmup, floor) for s in range(steps)]
    closed = [peak * min(1.0, (s + 1) / warmup) * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * s / steps)))
              for s in range(steps)]
    assert lrs == pytest.approx(closed, rel=8 * 2**-52)
    assert lrs[steps // 2] == pytest.approx(peak * (floor + (1 - floor) / 2), rel=8 * 2**-52)  # the cosine's midpoint
    # the inline LambdaLR the MoM runs used: same floats, so moving them onto `fit` changed no number
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=peak)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warmup) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, i / steps)))))
    seen = []
    for _ in range(steps):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == lrs


def test_the_schedule_sets_each_steps_learning_rate():
    # loss = p with SGD: each step moves p by exactly the learning rate of that step (float64, small integers of lr)
    p = nn.Parameter(torch.zeros((), dtype=torch.float64))
    schedule = partial(lr_at, total_steps=12, peak_lr=0.5, warmup_steps=3)
    seen = []
    fit([p], lambda _: p * 1.0, 12, _sgd(), schedule=schedule, after_step=lambda s: seen.append(float(p.detach())))
    moves = [-(b - a) for a, b in zip([0.0] + seen, seen)]
    assert moves == pytest.approx([schedule(s) for s in range(12)], rel=1e-12, abs=1e-15)


def test_clipping_scales_the_gradient_to_the_max_norm_and_reports_the_norm_before_it():
    g = torch.tensor([6.0, 8.0])  # norm 10
    clipped, free = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2))
    a = fit([clipped], lambda _: (g * clipped).sum(), 1, _sgd(), max_grad_norm=1.0)
    b = fit([free], lambda _: (g * free).sum(), 1, _sgd())
    assert a.grad_norms == b.grad_norms == [10.0]
    assert torch.equal(free.detach(), -g)
    # clip_grad_norm_ multiplies by 1 / (10 + 1e-6): a unit step along -g, to fp32 rounding of a few operations
    assert torch.allclose(clipped.detach(), -g / 10, rtol=4 * torch.finfo(torch.float32).eps, atol=0)


def test_the_same_numbers_as_a_hand_written_loop():
    """Adam, warmup-stable-decay, clipping, batches drawn inside loss_at: bit for bit what the loops it replaced did."""
    x, y = torch.randn(64, 5, generator=torch.Generator().manual_seed(1)), torch.randn(64, 3, generator=torch.Generator().manual_seed(2))
    schedule = partial(warmup_stable_decay, total_steps=30, peak_lr=0.05, warmup_steps=3, decay_steps=6, final_lr_ratio=0.01)

    def run(use_fit: bool) -> tuple[list[float], torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
        gen = torch.Generator().manual_seed(3)

        def loss_at(_: int) -> torch.Tensor:
            i = torch.randint(0, 64, (8,), generator=gen)
            return (model(x[i]) - y[i]).pow(2).mean()

        if use_fit:
            losses = fit(model, loss_at, 30, lambda ps: torch.optim.Adam(ps, lr=0.05), schedule=schedule,
                         max_grad_norm=0.5).losses
        else:
            opt, losses = torch.optim.Adam(model.parameters(), lr=0.05), []
            for step in range(30):
                for group in opt.param_groups:
                    group["lr"] = schedule(step)
                loss = loss_at(step)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
                losses.append(float(loss.detach()))
        return losses, torch.cat([p.detach().flatten() for p in model.parameters()])

    (fit_losses, fit_params), (ref_losses, ref_params) = run(True), run(False)
    assert fit_losses == ref_losses and torch.equal(fit_params, ref_params)
    again_losses, again_params = run(True)  # and deterministic
    assert again_losses == fit_losses and torch.equal(again_params, fit_params)


def test_a_quadratic_converges_at_the_rate_of_gradient_descent():
    # 0.5 ||p - c||^2 with SGD at lr 0.1: p_k - c = 0.9^k (p_0 - c) exactly up to float64 rounding
    c = torch.tensor([3.0, -2.0, 0.5], dtype=torch.float64)
    p = nn.Parameter(torch.zeros(3, dtype=torch.float64))
    result = fit([p], lambda _: 0.5 * (p - c).pow(2).sum(), 200, _sgd(0.1))
    assert torch.allclose(p.detach(), c - 0.9**200 * c, rtol=0, atol=1e-12)
    assert result.steps == 200 and result.losses[-1] < 1e-15 * result.losses[0]
    assert all(a > b for a, b in zip(result.losses, result.losses[1:]))


def test_a_non_finite_loss_raises_naming_the_step_before_the_optimizer_moves():
    p = nn.Parameter(torch.ones(1))
    values = [1.0, 0.5, float("nan")]
    with pytest.raises(NumericalError, match=r"the loss became nan at step 3; the last finite loss was 0\.25"):
        fit([p], lambda s: p.sum() * values[s], 5, _sgd(0.5))
    assert torch.equal(p.detach(), torch.tensor([0.25]))  # two steps taken (1 - 0.5 - 0.25, exact), the third refused
    assert p.grad is None


def test_a_non_finite_gradient_raises_and_stop_mode_returns_what_happened():
    p = nn.Parameter(torch.zeros(1))
    # sqrt at 0: a finite loss (0) with an infinite gradient
    with pytest.raises(NumericalError, match="my fit stopped: the gradient norm became inf at step 1"):
        fit([p], lambda _: p.sqrt().sum(), 3, _sgd(), desc="my fit")
    assert torch.equal(p.detach(), torch.zeros(1)) and p.grad is None
    q = nn.Parameter(torch.ones(1))
    result = fit([q], lambda s: q.sum() * (float("inf") if s == 2 else 1.0), 5, _sgd(0.25), on_nonfinite="stop")
    assert result.diverged == "the loss became inf at step 3"
    assert result.losses == [1.0, 0.75] and torch.equal(q.detach(), torch.tensor([0.5]))


def test_after_step_runs_after_each_update_and_a_module_trains_only_what_requires_grad():
    model = nn.Linear(2, 1)
    model.bias.requires_grad_(False)
    bias, calls = model.bias.detach().clone(), []
    result = fit(model, lambda _: model(torch.ones(1, 2)).sum(), 3, _sgd(0.1),
                 after_step=lambda s: calls.append((s, float(model.weight.detach().sum()))))
    assert [s for s, _ in calls] == [0, 1, 2] and calls[0][1] > calls[1][1] > calls[2][1]
    assert torch.equal(model.bias.detach(), bias) and result.optimizer.param_groups[0]["params"] == [model.weight]


def test_bad_input():
    p = nn.Parameter(torch.zeros(1))
    loss = lambda _: p.sum()  # noqa: E731
    with pytest.raises(InvalidInputError, match="steps"):
        fit([p], loss, 0, _sgd())
    with pytest.raises(InvalidInputError, match="max_grad_norm"):
        fit([p], loss, 1, _sgd(), max_grad_norm=0.0)
    with pytest.raises(InvalidInputError, match="on_nonfinite"):
        fit([p], loss, 1, _sgd(), on_nonfinite="skip")
    with pytest.raises(InvalidInputError, match="scalar"):
        fit([p], lambda _: p * torch.ones(2), 1, _sgd())
    with pytest.raises(InvalidInputError, match="nothing to fit"):
        fit([torch.zeros(1)], loss, 1, _sgd())
    other = nn.Parameter(torch.zeros(1))
    with pytest.raises(InvalidInputError, match="does not update 1"):
        fit([p, other], loss, 1, torch.optim.SGD([p], lr=1.0))
    two_rates = torch.optim.SGD([{"params": [p], "lr": 1.0}, {"params": [other], "lr": 0.1}])
    with pytest.raises(InvalidInputError, match="different"):
        fit([p, other], loss, 1, two_rates, schedule=lambda _: 1.0)
    fit([p, other], loss, 1, two_rates)  # without a schedule each group keeps its own rate
    assert [g["lr"] for g in two_rates.param_groups] == [1.0, 0.1]
