"""WASI's maths: the card's invariants, each able to fail. Float64 where an equality is exact up to rounding.

- at full rank (eps = 1, full Tucker ranks) every WASI form equals the dense layer: forward, input gradient, weight
  gradient (the low-memory form: the effective update dL R + L dR) and bias gradient;
- the Tucker-factor weight gradient equals dY^T reconstruct(S, U); full-rank HOSVD reconstructs A exactly;
- repeated WSI steps on a fixed W converge to its top-K left singular subspace; the factored step keeps L R and
  makes L orthonormal; the warm-started power step converges to the leading eigenvectors;
- the rank rule is the smallest K reaching eps; the knapsack respects its budget and matches brute force;
- the low-memory update equals the paper's (dense W, SGD, WSI step) to first order: the gap scales as step^2;
- a training forward saves exactly the Tucker core, the three factors and L, R (saved_tensors_hooks), whose bytes
  are the analytic count.
"""

import itertools

import pytest
import torch
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.recipes.wasi import (ActivationSubspace, LinearGeometry, RankOption, WasiLinear, choose_options,
                                   explained_variance_rank, factored_step, gradient_against, hosvd_bases,
                                   initial_factors, memory_numel, power_step, reconstruct, subspace_step, tucker_core)

pytestmark = pytest.mark.method("wasi")


def _linear(i=6, o=7, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return nn.Linear(i, o).to(dtype)


def _copy(linear):
    out = nn.Linear(linear.in_features, linear.out_features).to(linear.weight.dtype)
    out.load_state_dict(linear.state_dict())
    return out


@pytest.mark.parametrize("weights, activations", [("factored", "tucker"), ("master", "tucker"), ("dense", "tucker"),
                                                   ("factored", "exact"), ("master", "exact")])
@pytest.mark.parametrize("shape", [(4, 5, 6, 7), (3, 4, 9, 5), (6, 0, 6, 8)])  # O > I, O < I; N = 0: a 2-D input
def test_full_rank_wasi_equals_the_dense_layer(weights, activations, shape):
    b, n, i, o = shape
    dense = _linear(i, o)
    layer = WasiLinear.from_linear(_copy(dense), weights, activations, epsilon=1.0, activation_epsilon=1.0)
    assert layer.rank in (None, min(i, o))
    x = torch.randn((b, n, i) if n else (b, i), dtype=torch.float64)
    g = torch.randn((b, n, o) if n else (b, o), dtype=torch.float64)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y1, y2 = layer(x1), dense(x2)
    (y1 * g).sum().backward()
    (y2 * g).sum().backward()
    torch.testing.assert_close(y1, y2, rtol=0, atol=1e-12)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(layer.bias.grad, dense.bias.grad, rtol=0, atol=1e-12)
    if weights == "factored":
        effective = layer.L.grad @ layer.R + layer.L @ layer.R.grad  # the first-order change of W = L R
        torch.testing.assert_close(effective, dense.weight.grad, rtol=0, atol=1e-10)
    else:
        torch.testing.assert_close(layer.weight.grad, dense.weight.grad, rtol=0, atol=1e-12)


def test_truncated_wasi_is_not_the_dense_layer():
    """The full-rank test above can fail: at eps < 1 the same comparison shows a gap."""
    dense = _linear(12, 10)
    layer = WasiLinear.from_linear(_copy(dense), "factored", "tucker", epsilon=0.6, activation_epsilon=0.6)
    x = torch.randn(4, 5, 12, dtype=torch.float64)
    assert layer.rank < 10 and (layer(x) - dense(x)).abs().max() > 1e-3


def test_factor_gradient_equals_the_gradient_of_the_reconstruction():
    a = torch.randn(5, 6, 7, dtype=torch.float64)
    g = torch.randn(5, 6, 4, dtype=torch.float64)
    bases, ranks = hosvd_bases(a, ranks=(3, 4, 5))
    core = tucker_core(a, bases)
    assert tuple(core.shape) == tuple(ranks) == (3, 4, 5)
    expected = torch.einsum("bno,bni->oi", g, reconstruct(core, bases))
    torch.testing.assert_close(gradient_against(g, core, bases) @ bases[2].t(), expected, rtol=0, atol=1e-12)
    exact = torch.einsum("bno,bni->oi", g, a)
    assert (expected - exact).abs().max() > 1e-3  # truncated: not the exact gradient


@pytest.mark.parametrize("shape", [(4, 5, 6), (2, 3, 40)])  # the second takes the P x P Gram path (P = 6 < 40)
def test_full_rank_hosvd_reconstructs_exactly(shape):
    a = torch.randn(*shape, dtype=torch.float64)
    bases, ranks = hosvd_bases(a, epsilon=1.0)
    assert ranks == [min(d, a.numel() // d) for d in shape]
    torch.testing.assert_close(reconstruct(tucker_core(a, bases), bases), a, rtol=0, atol=1e-10)
    for u in bases:
        torch.testing.assert_close(u.t() @ u, torch.eye(u.shape[1], dtype=u.dtype), rtol=0, atol=1e-10)


def _sines(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Sines of the principal angles between the column spaces of orthonormal u and v (from the residual of u
    projected on v, accurate for small angles, unlike sqrt(1 - cos^2))."""
    return torch.linalg.svdvals(u - v @ (v.t() @ u))


def test_repeated_wsi_steps_converge_to_the_top_singular_subspace():
    torch.manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(20, 20, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(15, 15, dtype=torch.float64))
    s = torch.tensor([10.0, 8.0, 6.0] + [1.0 / (j + 2) for j in range(12)], dtype=torch.float64)
    w = (u[:, :15] * s) @ v.t()
    l = torch.linalg.qr(torch.randn(20, 3, dtype=torch.float64)).Q  # a random start, not the SVD one
    start = _sines(l, u[:, :3]).max()
    for _ in range(30):
        l, r = subspace_step(w, l)
    assert start > 0.1 and _sines(l, u[:, :3]).max() < 1e-4
    torch.testing.assert_close(l @ r, l @ l.t() @ w)  # R projects W on the refreshed subspace


def test_factored_step_keeps_the_product_and_orthonormalises():
    torch.manual_seed(1)
    l, r = torch.randn(12, 4), torch.randn(4, 9)  # L far from orthonormal (as after an optimizer step)
    new_l, new_r = factored_step(l, r)
    torch.testing.assert_close(new_l @ new_r, l @ r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new_l.t() @ new_l, torch.eye(4), rtol=0, atol=1e-5)
    assert (new_l.t() @ new_l - torch.eye(4)).abs().max() < 1e-5 < (l.t() @ l - torch.eye(4)).abs().max()


def test_warm_started_power_steps_converge_to_the_leading_eigenvectors():
    torch.manual_seed(2)
    planted = reconstruct(torch.randn(2, 2, 3) * 3, [torch.linalg.qr(torch.randn(d, r)).Q for d, r in ((6, 2), (5, 2), (30, 3))])
    a = planted + 0.05 * torch.randn(6, 5, 30)  # a (2, 2, 3) Tucker signal in noise: clear eigen-gaps
    exact, _ = hosvd_bases(a.double(), ranks=(2, 2, 3))
    rough = [torch.linalg.qr(torch.randn(d, r)).Q for d, r in zip(a.shape, (2, 2, 3))]
    for _ in range(60):
        rough = power_step(a, rough)
    for u, e in zip(rough, exact):
        assert _sines(u.double(), e).max() < 1e-3


def test_a_mode_whose_size_changes_is_recomputed_at_its_rank():
    sub = ActivationSubspace(epsilon=0.9)
    sub.compress(torch.randn(4, 6, 8))
    ranks = sub.ranks
    core, bases = sub.compress(torch.randn(4, 3, 8))  # fewer tokens: the token factor cannot warm-start
    assert sub.ranks == ranks and bases[1].shape == (3, min(ranks[1], 3)) and core.shape[1] == min(ranks[1], 3)


@pytest.mark.parametrize("seed", range(5))
def test_the_rank_rule_is_the_smallest_k_reaching_epsilon(seed):
    energies = torch.rand(12, generator=torch.Generator().manual_seed(seed)).sort(descending=True).values
    share = torch.cumsum(energies.double(), 0) / energies.double().sum()
    for eps in (0.05, 0.3, 0.5, 0.77, 0.9, 0.999, 1.0):
        k = explained_variance_rank(energies, eps)
        assert share[k - 1] >= eps - 1e-12 and (k == 1 or share[k - 2] < eps)
    w = torch.randn(9, 7, dtype=torch.float64)
    l, r = initial_factors(w, 0.8)
    assert l.shape[1] == explained_variance_rank(torch.linalg.svdvals(w).square(), 0.8)


def test_the_rank_rule_refuses_thresholds_outside_the_unit_interval():
    for bad in (0.0, -0.1, 1.5, float("nan"), True):
        with pytest.raises(InvalidInputError):
            explained_variance_rank(torch.ones(3), bad)


def _brute(options, budget):
    best = None
    for picks in itertools.product(*[range(len(o)) for o in options]):
        cost = sum(o[i].bytes for o, i in zip(options, picks))
        loss = sum(o[i].perplexity for o, i in zip(options, picks))
        if cost <= budget and (best is None or (loss, cost) < best[:2]):
            best = (loss, cost, picks)
    return best


@pytest.mark.parametrize("seed", range(8))
def test_the_knapsack_respects_the_budget_and_matches_brute_force(seed):
    gen = torch.Generator().manual_seed(seed)
    layers = int(torch.randint(2, 5, (1,), generator=gen))
    options = []
    for _ in range(layers):
        costs = torch.randint(1, 50, (4,), generator=gen).tolist()
        losses = torch.rand(4, generator=gen).tolist()
        options.append([RankOption(0.5, (1, 1, 1), c, p) for c, p in zip(costs, losses)])
    smallest = sum(min(o.bytes for o in layer) for layer in options)
    budget = smallest + int(torch.randint(0, 60, (1,), generator=gen))
    picks = choose_options(options, budget)
    cost = sum(o[i].bytes for o, i in zip(options, picks))
    loss = sum(o[i].perplexity for o, i in zip(options, picks))
    best = _brute(options, budget)
    assert cost <= budget and abs(loss - best[0]) < 1e-12
    with pytest.raises(InvalidInputError, match="fits no choice"):
        choose_options(options, smallest - 1)


def test_the_low_memory_update_equals_the_papers_to_first_order():
    torch.manual_seed(0)
    b, n, i, o, k = 4, 5, 12, 10, 3
    w0 = torch.randn(o, k, dtype=torch.float64) @ torch.randn(k, i, dtype=torch.float64)  # exactly rank K
    x, g = torch.randn(b, n, i, dtype=torch.float64), torch.randn(b, n, o, dtype=torch.float64)

    def one_step(weights, eta):
        linear = _linear(i, o)
        with torch.no_grad():
            linear.weight.copy_(w0)
        layer = WasiLinear.from_linear(linear, weights, "exact", epsilon=0.999999)
        (layer(x) * g).sum().backward()
        with torch.no_grad():
            for p in layer.parameters():
                p -= eta * p.grad
        layer.refresh()
        return layer.dense_weight()

    gaps = [(one_step("factored", eta) - one_step("master", eta)).norm() for eta in (4e-3, 2e-3, 1e-3)]
    moved = (one_step("master", 1e-3) - w0).norm()
    assert moved > 10 * gaps[-1]  # the step itself is first order, the gap second order
    assert 3.0 < gaps[0] / gaps[1] < 5.0 and 3.0 < gaps[1] / gaps[2] < 5.0  # halving the step quarters the gap


@pytest.mark.parametrize("weights", ["factored", "master", "dense"])
def test_a_training_forward_saves_only_the_tucker_factors_and_l_r(weights):
    layer = WasiLinear.from_linear(_linear(16, 24, dtype=torch.float32), weights, "tucker", epsilon=0.7)
    x = torch.randn(8, 6, 16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = layer(x)
    kept = layer.activation.bases
    allowed = {id(t) for t in kept} | ({id(layer.L), id(layer.R)} if weights != "dense" else {id(layer.weight)})
    others = [t for t in saved if id(t) not in allowed]
    assert len(others) == 1 and tuple(others[0].shape) == layer.activation_ranks  # the core, nothing else
    assert not any(t.data_ptr() == x.data_ptr() for t in saved)  # the input is never saved
    geo = LinearGeometry(24, 16, True, weights, "tucker", layer.rank or 0, layer.activation_ranks)
    counted = memory_numel(geo, 8, 6)
    activation_numel = sum(t.numel() for t in saved if id(t) not in {id(getattr(layer, "L", None)), id(getattr(layer, "R", None)),
                                                                      id(getattr(layer, "weight", None))})
    assert activation_numel == counted["activations"]
    held = sum(p.numel() for p in layer.parameters()) + sum(b.numel() for b in layer.buffers())
    assert held == counted["weights"] + counted["dense_master"]
    y.sum().backward()
    if weights == "factored":
        assert not hasattr(layer, "weight") and {n for n, _ in layer.named_parameters()} == {"L", "R", "bias"}


def test_layers_refuse_what_they_cannot_compress():
    with pytest.raises(InvalidInputError, match="nn.Linear"):
        WasiLinear.from_linear(nn.Conv1d(2, 2, 1))
    with pytest.raises(InvalidInputError, match=r"\(0, 1\]"):
        WasiLinear.from_linear(_linear(), epsilon=1.2)
    layer = WasiLinear.from_linear(_linear(4, 3, dtype=torch.float32))
    with pytest.raises(InvalidInputError, match="4-D"):
        layer(torch.randn(2, 3, 4, 4, requires_grad=True))
