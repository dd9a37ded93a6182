"""LRNN: the card's invariants (MLP reduction, exact x1*x2, variance control, parameter counts, finite gradients),
the layer's formula, SIREN, the differentiable Radon transform against skimage, and bad input."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from rankwise.errors import InvalidInputError, NumericalError, RankwiseError, UnknownNameError
from rankwise.nn.lrnn import (
    LRNN, LowRankSeparatedLayer, Siren, UnivariateComponents, layer_parameter_count, lrnn_parameter_count,
    radon_transform, siren_parameter_count,
)

pytestmark = pytest.mark.method("lrnn")


def _count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("act, sigma", [("tanh", torch.tanh), ("sine", torch.sin)])
def test_fixed_activation_mode_is_an_mlp(act, sigma):
    """Card invariant 1: factor -> fixed sigma(z), D = 1, no LayerNorm: LRNN == Linear, sigma, Linear exactly."""
    torch.manual_seed(0)
    net = LRNN(3, 2, ranks=(5,), proj_dim=1, layer_norm=False, fixed_activation=act)
    mlp = nn.Sequential(nn.Linear(3, 5), nn.Identity(), nn.Linear(5, 2))
    mlp[0].load_state_dict(net.layers[0].projection.state_dict())
    mlp[2].load_state_dict(net.readout.state_dict())
    x = torch.randn(7, 3)
    expected = mlp[2](sigma(mlp[0](x)))
    assert torch.equal(net(x), expected)
    assert _count(net) == _count(mlp)


def test_fixed_activation_with_two_factors_is_not_an_mlp():
    """The reduction needs D = 1: with D = 2 the neuron is a product of two sigmas, which the MLP is not."""
    torch.manual_seed(0)
    net = LRNN(3, 1, ranks=(4,), proj_dim=2, layer_norm=False, fixed_activation="tanh")
    z = net.layers[0].projection(torch.randn(6, 3)).unflatten(-1, (4, 2))
    assert not torch.allclose(torch.tanh(z).prod(-1), torch.tanh(z[..., 0]))


def _exact_product_net() -> LRNN:
    # identity projections per neuron, g(t) = t, gamma = 1: neurons (1+x1)(1+x2), (1+x1), (1+x2)
    net = LRNN(2, 1, ranks=(3,), proj_dim=2, hidden=1, activation="identity", omega0=1.0, gamma=1.0,
               layer_norm=False).double()
    layer = net.layers[0]
    with torch.no_grad():
        w = torch.zeros(3, 2, 2, dtype=torch.float64)
        w[0] = torch.eye(2)
        w[1, 0, 0] = 1.0
        w[2, 1, 1] = 1.0
        layer.projection.weight.copy_(w.reshape(6, 2))
        layer.projection.bias.zero_()
        layer.components.u.fill_(1.0)
        layer.components.c.zero_()
        layer.components.a.fill_(1.0)
        layer.components.e.zero_()
        net.readout.weight.copy_(torch.tensor([[1.0, -1.0, -1.0]], dtype=torch.float64))
        net.readout.bias.fill_(1.0)
    return net


def test_rank3_lrnn_represents_x1_x2_exactly():
    """Card invariant 4: (1+x1)(1+x2) - (1+x1) - (1+x2) + 1 = x1 x2."""
    net = _exact_product_net()
    x = torch.rand(1000, 2, dtype=torch.float64) * 4 - 2
    err = (net(x).squeeze(-1) - x[:, 0] * x[:, 1]).abs().max()
    # float64: a few roundings of the neurons, which are as large as (1 + |x1|)(1 + |x2|) <= 9
    assert err <= 64 * torch.finfo(torch.float64).eps * float((1 + x.abs()).prod(-1).max())
    # and the representation is not trivial: dropping the correction neurons breaks it
    with torch.no_grad():
        net.readout.weight[0, 1:] = 0.0
    assert (net(x).squeeze(-1) - x[:, 0] * x[:, 1]).abs().max() > 0.1


def test_layer_computes_the_product_formula():
    """y_l = prod_j (1 + gamma * sum_m a sigma(omega0 (u z_j + c)) + e), entry by entry, float64."""
    torch.manual_seed(1)
    layer = LowRankSeparatedLayer(3, 4, proj_dim=5, hidden=3, omega0=7.0, layer_norm=False).double()
    with torch.no_grad():
        layer.components.e.normal_()
    x = torch.randn(6, 3, dtype=torch.float64)
    z = (x @ layer.projection.weight.T + layer.projection.bias).reshape(6, 4, 5)
    comp = layer.components
    expected = torch.ones(6, 4, dtype=torch.float64)
    for l_ in range(4):
        for j in range(5):
            g = sum(comp.a[l_, j, m] * torch.sin(7.0 * (comp.u[l_, j, m] * z[:, l_, j] + comp.c[l_, j, m]))
                    for m in range(3)) + comp.e[l_, j]
            expected[:, l_] *= 1 + 5 ** -0.5 * g
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)


def test_shared_components_are_one_set_for_all_neurons():
    torch.manual_seed(2)
    comp = UnivariateComponents(rank=4, proj_dim=3, hidden=2, shared=True)
    z = torch.randn(5, 1, 3).expand(5, 4, 3)  # the same z for every neuron
    g = comp(z)
    assert torch.equal(g, g[:, :1].expand_as(g))
    assert comp.u.shape == (1, 3, 2)


@pytest.mark.parametrize("kw", [dict(), dict(layer_norm=False), dict(shared_components=True), dict(ranks=(7, 3, 5)),
                                dict(fixed_activation="tanh"), dict(proj_dim=1, hidden=6)])
def test_parameter_count_formula_and_shapes(kw):
    """Card invariant 2: output [..., K]; the count formula equals sum(p.numel())."""
    args = dict(ranks=(6, 4), proj_dim=3, hidden=2) | kw
    net = LRNN(5, 3, **args, omega0=3.0)
    count_kw = {k: v for k, v in args.items()}
    assert lrnn_parameter_count(5, 3, **count_kw) == _count(net)
    assert net(torch.randn(2, 7, 5)).shape == (2, 7, 3)
    assert net(torch.randn(5)).shape == (3,)


def test_layer_count_includes_every_parameter():
    layer = LowRankSeparatedLayer(4, 6, proj_dim=2, hidden=3)
    assert layer_parameter_count(4, 6, 2, 3) == _count(layer) == 5 * 12 + 12 * 10 + 12


def _init_variance(proj_dim: int, gamma: float | None, seed: int = 0) -> tuple[float, float]:
    """(mean over neurons of Var_x[product], mean over components of Var_x[g]) at init, 4k inputs, float64.

    1024 components in all (rank = 1024 / D neurons), so every D averages over as many random component draws."""
    torch.manual_seed(seed)
    rank = 1024 // proj_dim
    layer = LowRankSeparatedLayer(16, rank, proj_dim=proj_dim, hidden=4, omega0=30.0, gamma=gamma,
                                  layer_norm=False).double()
    x = torch.randn(4000, 16, dtype=torch.float64)
    with torch.no_grad():
        z = layer.projection(x).unflatten(-1, (rank, proj_dim))
        g = layer.components(z)
        y = layer(x)
    return float(y.var(0).mean()), float(g.var(0).mean())


def test_init_variance_is_controlled_by_gamma():
    """Card invariant 3: with gamma = D^-1/2 Var[prod] stays ~constant and below e^{sigma_g^2} - 1 (+ sampling
    slack); with gamma = 1 it grows with D."""
    controlled = {}
    for d in (4, 16, 64, 256):
        v, sg2 = _init_variance(d, None)
        # 4k samples: a variance estimate of a heavy-ish tailed product has relative error ~ 5-10%
        assert v <= math.exp(sg2) - 1 + 0.1 * math.exp(sg2), (d, v, sg2)
        controlled[d] = v
    assert max(controlled.values()) / min(controlled.values()) < 1.5
    unit = [_init_variance(d, 1.0)[0] for d in (4, 16)]
    assert unit[1] > 10 * unit[0]
    assert unit[0] > 2 * controlled[4]


def test_gradients_finite_at_init_depth_4():
    """Card invariant 5."""
    torch.manual_seed(3)
    net = LRNN(2, 1, ranks=(16, 16, 16, 16), proj_dim=8, hidden=4)
    loss = net(torch.rand(256, 2) * 2 - 1).pow(2).mean()
    loss.backward()
    for name, p in net.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("act", ["spder", "sinarctan", "tanh"])
def test_other_activations_have_finite_gradients_at_zero(act):
    layer = LowRankSeparatedLayer(1, 2, proj_dim=2, hidden=2, activation=act, layer_norm=False)
    with torch.no_grad():
        layer.components.c.zero_()
    x = torch.zeros(3, 1, requires_grad=True)
    layer(x).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_classifier_separates_two_moons():
    """Usable as a classifier: logits for cross-entropy, fitted to near-perfect training accuracy."""
    from sklearn.datasets import make_moons

    xs, ys = make_moons(300, noise=0.1, random_state=0)
    x, y = torch.tensor(xs, dtype=torch.float32), torch.tensor(ys)
    torch.manual_seed(0)
    net = LRNN(2, 2, ranks=(8, 8), proj_dim=4, hidden=4, omega0=1.0)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    assert (net(x).argmax(-1) == y).float().mean() > 0.97


def test_siren_shapes_count_and_init():
    torch.manual_seed(0)
    s = Siren(2, 3, width=20, depth=3)
    assert _count(s) == siren_parameter_count(2, 3, 20, 3)
    assert s(torch.rand(4, 2)).shape == (4, 3)
    assert s.hidden[0].weight.abs().max() <= 0.5
    assert s.hidden[1].weight.abs().max() <= math.sqrt(6 / 20) / 30 * (1 + torch.finfo(torch.float32).eps)  # bound in fp32


def test_siren_spder_is_the_same_network_with_the_damped_sine():
    """SPDER: SIREN's layers and init, sin(x) sqrt|x| on the same pre-activations (checked in float64)."""
    torch.manual_seed(0)
    sp = Siren(2, 1, width=12, depth=2, activation="spder").double()
    x = torch.rand(5, 2, dtype=torch.float64) * 2 - 1
    h = x
    for lin in sp.hidden:
        pre = 30.0 * lin(h)
        h = torch.sin(pre) * pre.abs().sqrt()
    torch.testing.assert_close(sp(x), sp.out(h), rtol=1e-12, atol=1e-12)
    torch.manual_seed(0)
    sine = Siren(2, 1, width=12, depth=2)
    assert all(torch.equal(a, b) for a, b in zip(sine.state_dict().values(), sp.float().state_dict().values()))
    with pytest.raises(UnknownNameError):
        Siren(2, 1, activation="no-such")


@pytest.mark.parametrize("module", [lambda: LRNN(3, 1, ranks=(4,)), lambda: LowRankSeparatedLayer(3, 4),
                                    lambda: Siren(3, 1, 8, 2)])
@pytest.mark.parametrize("bad, error", [
    (torch.randn(5, 4), InvalidInputError),          # last dim does not match in_features
    (torch.randn(0, 3), InvalidInputError),           # empty batch
    (torch.full((2, 3), float("nan")), NumericalError),
    (torch.tensor([[1.0, float("inf"), 0.0]]), NumericalError),
    (torch.ones(2, 3, dtype=torch.int64), InvalidInputError),
    ([[1.0, 2.0, 3.0]], InvalidInputError),
])
def test_bad_input_is_refused(module, bad, error):
    with pytest.raises(error):
        module()(bad)


@pytest.mark.parametrize("kw, error", [
    (dict(ranks=()), InvalidInputError), (dict(ranks=(0,)), InvalidInputError), (dict(proj_dim=0), InvalidInputError),
    (dict(hidden=-1), InvalidInputError), (dict(activation="relu6"), UnknownNameError),
    (dict(fixed_activation="nope"), UnknownNameError), (dict(gamma=float("nan")), InvalidInputError),
])
def test_bad_construction_is_refused(kw, error):
    with pytest.raises(error):
        LRNN(2, 1, **kw)
    assert issubclass(error, RankwiseError)


def test_radon_matches_skimage():
    """Same conventions as skimage.transform.radon(circle=True): float64 agreement to rounding."""
    from skimage.data import shepp_logan_phantom
    from skimage.transform import radon, resize

    from rankwise.nn.lrnn import circle_mask

    img = resize(shepp_logan_phantom(), (48, 48), anti_aliasing=True) * circle_mask(48, torch.float64).numpy()
    theta = np.linspace(0.0, 180.0, 17, endpoint=False)
    ref = radon(img, theta, circle=True)
    ours = radon_transform(torch.tensor(img), torch.tensor(theta)).numpy()
    assert ours.shape == ref.shape == (48, 17)
    # bilinear interpolation in both; float64 sums of 48 terms of size <= 1: rounding ~ 1e-14 of the scale
    assert np.abs(ours - ref).max() <= 1e-10 * np.abs(ref).max()
    odd = resize(shepp_logan_phantom(), (31, 31), anti_aliasing=True) * circle_mask(31, torch.float64).numpy()
    assert np.allclose(radon_transform(torch.tensor(odd), torch.tensor(theta)).numpy(), radon(odd, theta, circle=True),
                       rtol=0, atol=1e-10)


def test_radon_is_linear_differentiable_and_batched():
    gen = torch.Generator().manual_seed(0)
    imgs = torch.rand(2, 3, 9, 9, generator=gen, dtype=torch.float64)
    angles = [0.0, 33.0, 90.0]
    batch = radon_transform(imgs, angles)
    assert batch.shape == (2, 3, 9, 3)
    torch.testing.assert_close(batch[1, 2], radon_transform(imgs[1, 2], angles))
    img = imgs[0, 0].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: radon_transform(t, angles), (img,))
    # at angle 0 the projection is the column sums
    torch.testing.assert_close(batch[..., 0], imgs.sum(-2))


@pytest.mark.parametrize("img, angles", [(torch.rand(4, 5), [0.0]), (torch.rand(4, 4), []),
                                         (torch.ones(3, 3, dtype=torch.int64), [0.0]),
                                         (torch.full((4, 4), float("nan")), [0.0])])
def test_radon_bad_input(img, angles):
    with pytest.raises(RankwiseError):
        radon_transform(img, angles)
