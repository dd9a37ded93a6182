"""The SPSA / MeZO core: perturb-restore, the estimate, the update with the same z, determinism, bad input."""

import pytest
import torch
from torch import nn

from rankwise.errors import InvalidInputError, NumericalError
from rankwise.optim.zeroth_order import SPSA, mezo_step, numerical_rank, step_seed

pytestmark = pytest.mark.method("lmao")
EPS64 = torch.finfo(torch.float64).eps


def _mlp(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Tanh(), nn.Linear(8, 3)).to(dtype)


def _loss(model, dtype=torch.float32):
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1), dtype=dtype)
    y = torch.tensor([0, 1, 2, 1, 0])
    return lambda: nn.functional.cross_entropy(model(x), y)


def _params(model):
    return list(model.named_parameters())


def test_exact_perturbation_leaves_the_weights_bit_for_bit_in_float32():
    model = _mlp()
    before = {n: p.clone() for n, p in model.named_parameters()}
    SPSA(model, _params(model), eps=1e-3).projected_gradient(_loss(model), seed=7)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("dtype,rel", [(torch.float64, None), (torch.float32, 1e-6)])
def test_in_place_restore_is_exact_up_to_rounding(dtype, rel):
    model = _mlp(dtype)
    before = {n: p.clone() for n, p in model.named_parameters()}
    spsa = SPSA(model, _params(model), eps=1e-3, perturbation="in-place")
    spsa.projected_gradient(_loss(model, dtype), seed=7)
    u = torch.finfo(dtype).eps / 2
    with torch.no_grad():
        for i, (n, p) in enumerate(model.named_parameters()):
            # three roundings of values of size |w| + 2 eps |z|: the bound follows from the unit roundoff u
            bound = 3 * u * (before[n].abs() + 2e-3 * spsa.noise(i, 7).abs())
            assert ((p - before[n]).abs() <= bound).all(), n
        if rel is not None:  # the card's figure, over all tensors together (a zero bias has no relative error)
            drift = torch.cat([(p - before[n]).flatten() for n, p in model.named_parameters()]).norm()
            assert float(drift / torch.cat([b.flatten() for b in before.values()]).norm()) <= rel


def test_exact_and_in_place_see_the_same_losses_in_float64():
    a, b = _mlp(torch.float64), _mlp(torch.float64)
    ea = SPSA(a, _params(a), 1e-3).projected_gradient(_loss(a, torch.float64), 3)
    eb = SPSA(b, _params(b), 1e-3, "in-place").projected_gradient(_loss(b, torch.float64), 3)
    assert ea == pytest.approx(eb, rel=1e-12, abs=1e-12)


def test_the_losses_are_those_of_explicitly_perturbed_weights():
    model = _mlp(torch.float64)
    spsa = SPSA(model, _params(model), 1e-3)
    plus, minus, g = spsa.projected_gradient(_loss(model, torch.float64), 11)
    for sign, want in ((1, plus), (-1, minus)):
        copy = _mlp(torch.float64)
        with torch.no_grad():
            for i, (_, p) in enumerate(copy.named_parameters()):
                p.add_(spsa.noise(i, 11), alpha=sign * 1e-3)
        assert float(_loss(copy, torch.float64)()) == pytest.approx(want, rel=1e-13)
    assert g == pytest.approx((plus - minus) / 2e-3)


def test_the_estimate_tracks_the_directional_derivative():
    model = _mlp(torch.float64)
    spsa = SPSA(model, _params(model), 1e-5)
    _, _, g = spsa.projected_gradient(_loss(model, torch.float64), 5)
    loss = _loss(model, torch.float64)()
    grads = torch.autograd.grad(loss, [p for _, p in _params(model)])
    exact = sum(float((gr * spsa.noise(i, 5)).sum()) for i, gr in enumerate(grads))
    assert g == pytest.approx(exact, rel=1e-6)


def test_the_update_uses_the_perturbation_noise_and_lr_zero_changes_nothing():
    model = _mlp(torch.float64)
    before = {n: p.clone() for n, p in model.named_parameters()}
    spsa = SPSA(model, _params(model), 1e-3)
    assert spsa.step(_loss(model, torch.float64), 9, lr=0.0).projected_grad != 0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    res = spsa.step(_loss(model, torch.float64), 9, lr=1e-2)
    for i, (n, p) in enumerate(model.named_parameters()):
        # p + update is rounded to p's ulp (u |p|); the update's own roundings are relative (rtol); 8x margin
        atol = 4 * EPS64 * float(before[n].abs().max())
        torch.testing.assert_close(p - before[n], -1e-2 * res.projected_grad * spsa.noise(i, 9), rtol=1e-12, atol=atol)


def test_weight_decay_only_on_matrices():
    model = _mlp(torch.float64)
    before = {n: p.clone() for n, p in model.named_parameters()}
    spsa = SPSA(model, _params(model), 1e-3)
    res = spsa.step(_loss(model, torch.float64), 2, lr=1e-2, weight_decay=0.5)
    for i, (n, p) in enumerate(model.named_parameters()):
        decay = (1 - 1e-2 * 0.5) if p.dim() >= 2 else 1.0
        atol = 4 * EPS64 * float(before[n].abs().max())  # a few roundings of values of p's size
        torch.testing.assert_close(p, before[n] * decay - 1e-2 * res.projected_grad * spsa.noise(i, 2), rtol=1e-12, atol=atol)


def test_noise_is_a_pure_function_of_seed_and_index_and_the_global_rng_is_untouched():
    model = _mlp()
    spsa = SPSA(model, _params(model))
    state = torch.get_rng_state()
    assert torch.equal(spsa.noise(2, step_seed(0, 5)), spsa.noise(2, step_seed(0, 5)))
    assert not torch.equal(spsa.noise(2, step_seed(0, 5)), spsa.noise(2, step_seed(0, 6)))
    assert not torch.equal(spsa.noise(0, step_seed(0, 5)), spsa.noise(0, step_seed(1, 5)))
    assert torch.equal(torch.get_rng_state(), state)
    assert step_seed(3, 4) == step_seed(3, 4) and step_seed(3, 4) != step_seed(4, 3)


def test_mezo_step_equals_two_independent_runs():
    a, b = _mlp(), _mlp()
    mezo_step(a, _params(a), _loss(a), 4, lr=1e-2)
    mezo_step(b, _params(b), _loss(b), 4, lr=1e-2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_a_zo_update_of_a_matrix_has_full_numerical_rank():
    model = _mlp(torch.float64)
    w0 = model[0].weight.clone()
    SPSA(model, _params(model), 1e-3).step(_loss(model, torch.float64), 1, lr=1e-2)
    assert numerical_rank(model[0].weight - w0) == min(w0.shape)
    assert numerical_rank(torch.outer(torch.ones(4), torch.ones(3))) == 1


def test_bad_input_is_refused_before_any_work():
    model = _mlp()
    with pytest.raises(InvalidInputError, match="eps"):
        SPSA(model, _params(model), eps=0.0)
    with pytest.raises(InvalidInputError, match="perturbation"):
        SPSA(model, _params(model), perturbation="sideways")
    with pytest.raises(InvalidInputError, match="empty"):
        SPSA(model, [])
    with pytest.raises(InvalidInputError, match="twice"):
        SPSA(model, _params(model) + _params(model)[:1])
    with pytest.raises(InvalidInputError, match="not parameters"):
        SPSA(model, [("x", torch.zeros(3))])
    with pytest.raises(InvalidInputError, match="learning rate"):
        SPSA(model, _params(model)).step(_loss(model), 0, lr=-1.0)
    with pytest.raises(InvalidInputError, match="2-D"):
        numerical_rank(torch.zeros(3))


def test_an_unused_tensor_and_a_non_finite_loss_are_reported_and_leave_the_weights():
    class WithSpare(nn.Module):
        def __init__(self):
            super().__init__()
            self.net, self.spare = _mlp(), nn.Linear(2, 2)  # `spare` is never called

        def forward(self, x):
            return self.net(x)

    model = WithSpare()
    with pytest.raises(InvalidInputError, match="not used"):
        SPSA(model, _params(model)).projected_gradient(_loss(model), 0)
    model = _mlp()
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(NumericalError, match="not finite"):
        SPSA(model, _params(model)).step(lambda: _loss(model)() * float("nan"), 0, lr=1.0)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
