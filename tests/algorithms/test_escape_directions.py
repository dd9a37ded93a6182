"""Card invariants of escape-directions: Example 1, homogeneity, Euler, fixed points, balancedness, norm growth."""

import math

import pytest
import torch

from rankwise.algorithms.escape_directions import (
    RANK_ONE_SPEED, backprop, balance, deep_layers, depth_gap, fixed_point_alignment, init_weights, layer_ratios,
    layer_shares, local_loss, local_loss_gradient, mse_gradient_at_zero, mse_loss, norm_growth,
    optimal_escape_direction, parameter_norm, rank_one_share, relu_gap, sigma_ratio, to_sphere, toy_data,
    toy_rank_two_escape, train_from_init,
)
from rankwise.core.threads import limit_threads
from rankwise.errors import RankwiseError

pytestmark = pytest.mark.method("escape-directions")
EPS = torch.finfo(torch.float64).eps


@pytest.fixture(autouse=True)
def _one_thread():
    """Thousands of tiny matmuls: a second intra-op thread only spin-waits (100x slower on a shared machine)."""
    with limit_threads(1, at_most=True):
        yield


def _problem(seed=0, d0=5, n=40, d_out=3, widths=(7, 6)):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(d0, n, generator=gen, dtype=torch.float64)
    g = torch.randn(d_out, n, generator=gen, dtype=torch.float64) / n
    ws = init_weights([d0, *widths, d_out], 1.0, gen)
    return x, g, ws, gen


def test_toy_construction_is_exact():
    x, g = toy_data()
    ws = toy_rank_two_escape()
    assert sum(float((w * w).sum()) for w in ws) == pytest.approx(3.0, abs=8 * EPS)
    assert all(float((w * w).sum()) == pytest.approx(1.0, abs=4 * EPS) for w in ws)
    # 8 products of magnitude <= 1/4, summed: a few ulps of 1/2.
    assert abs(-float(local_loss(ws, x, g)) - 0.5) <= 16 * EPS
    # Y = ReLU(|x1| - |x2|) / 4 on every point
    y = ws[2] @ torch.relu(ws[1] @ torch.relu(ws[0] @ x))
    assert torch.allclose(y, torch.relu(x[0].abs() - x[1].abs())[None] / 4, atol=8 * EPS, rtol=0)
    # the rank-2 first layer beats the best all-rank-1 speed
    assert torch.linalg.matrix_rank(ws[0]) == 2 and 0.5 > RANK_ONE_SPEED


def test_projected_gd_on_the_toy_beats_rank_one_when_wide():
    x, g = toy_data()
    rho = optimal_escape_direction(x, g, [2, 20, 20, 1], steps=400, restarts=8,
                                   generator=torch.Generator().manual_seed(0))
    assert rho.speed > RANK_ONE_SPEED + 0.01
    assert sum(float((w * w).sum()) for w in rho.weights) == pytest.approx(3.0, rel=1e-12)


@pytest.mark.parametrize("lam", [0.3, 1.7, 4.0])
def test_homogeneity(lam):
    x, g, ws, _ = _problem()
    depth = len(ws)
    base = float(local_loss(ws, x, g))
    scaled = float(local_loss([lam * w for w in ws], x, g))
    # relative rounding of a depth-3 product summed over 40 samples: well under 1e3 ulps
    assert scaled == pytest.approx(lam ** depth * base, rel=1e3 * EPS)
    # ReLU nets are also homogeneous per layer (positive scaling of one layer)
    one = [w.clone() for w in ws]
    one[1] = one[1] * lam
    assert float(local_loss(one, x, g)) == pytest.approx(lam * base, rel=1e3 * EPS)


def test_euler_identity_and_hand_backprop_match_autograd():
    x, g, ws, _ = _problem(1)
    value, grads = local_loss_gradient(ws, x, g)
    inner = sum(float((gr * w).sum()) for gr, w in zip(grads, ws))
    assert inner == pytest.approx(len(ws) * value, rel=1e3 * EPS)
    req = [w.clone().requires_grad_(True) for w in ws]
    auto = torch.autograd.grad(local_loss(req, x, g), req)
    for a, b in zip(grads, auto):
        assert torch.allclose(a, b, rtol=1e3 * EPS, atol=1e3 * EPS * float(b.abs().max()))
    # the MSE gradient through the same backward pass
    y_star = torch.randn(3, x.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    _, mgrads = backprop(ws, x, lambda y: (y - y_star) / y.shape[1])
    auto = torch.autograd.grad(mse_loss(req, x, y_star), req)
    for a, b in zip(mgrads, auto):
        assert torch.allclose(a, b, rtol=1e3 * EPS, atol=1e3 * EPS * float(b.abs().max()))


def test_local_loss_is_the_first_order_term_of_the_mse():
    x, _, ws, gen = _problem(3)
    y_star = torch.randn(3, x.shape[1], generator=gen, dtype=torch.float64)
    g = mse_gradient_at_zero(y_star)
    c0 = float((y_star ** 2).sum() / (2 * x.shape[1]))
    for eps in (1e-2, 1e-3):
        small = [eps * w for w in ws]
        # C(theta) = C(0) + L_0(theta) + ||Y||^2 / (2N), and ||Y||^2 = O(eps^(2L))
        resid = float(mse_loss(small, x, y_star)) - c0 - float(local_loss(small, x, g))
        y = small[2] @ torch.relu(small[1] @ torch.relu(small[0] @ x))
        assert resid == pytest.approx(float((y ** 2).sum()) / (2 * x.shape[1]), abs=1e3 * EPS * c0)


def test_projected_gd_converges_to_a_fixed_point():
    x, g, _, gen = _problem(4, d0=6, n=60, d_out=2, widths=(8, 8, 8))
    rho = optimal_escape_direction(x, g, [6, 8, 8, 8, 2], steps=1500, restarts=2, generator=gen)
    assert rho.alignment > 0.999
    assert rho.speed > 0 and rho.speed == max(rho.restart_speeds)
    assert fixed_point_alignment(rho.weights, x, g) == pytest.approx(rho.alignment, abs=1e-12)
    # a random point of the sphere is far from a fixed point
    assert fixed_point_alignment(to_sphere(init_weights([6, 8, 8, 8, 2], 1.0, gen)), x, g) < 0.99


def test_deep_linear_escape_direction_is_rank_one():
    x, g, _, gen = _problem(5, d0=6, n=50, d_out=3, widths=(8, 8))
    rho = optimal_escape_direction(x, g, [6, 8, 8, 3], steps=800, restarts=1, generator=gen, relu=False)
    # the linear optimum is s_max(G X^T) ... every layer rank one, balanced at norm 1
    assert min(layer_shares(rho.weights)) > 1 - 1e-6
    top = float(torch.linalg.svdvals(g @ x.T)[0])
    assert rho.speed == pytest.approx(top, rel=1e-6)


def test_balancedness_is_conserved_by_small_step_gd():
    x, _, _, gen = _problem(6)
    y_star = torch.randn(3, x.shape[1], generator=gen, dtype=torch.float64)
    ws = init_weights([5, 7, 6, 3], 0.5, gen)
    before = balance(ws)
    traj = train_from_init(x, y_star, ws, steps=300, eta=1e-3, rule="constant", log_every=100)
    after = balance(traj.final_weights)
    moved = max(abs(float((a * a).sum() - (b * b).sum())) for a, b in zip(traj.final_weights, ws))
    assert moved > 1e-3  # the weights did change
    # GD departs from the flow's conservation law by O(lr) per step in relative terms: far below the movement
    assert max(abs(a - b) for a, b in zip(after, before)) < 0.05 * moved


def test_the_deep_linear_option_trains_the_linear_net_of_the_same_widths():
    x, _, _, gen = _problem(6)
    y_star = torch.randn(3, x.shape[1], generator=gen, dtype=torch.float64)
    ws = init_weights([5, 7, 6, 3], 0.5, gen)
    linear = train_from_init(x, y_star, ws, steps=1, eta=1e-2, rule="constant", log_every=1, relu=False)
    product = ws[2] @ ws[1] @ ws[0]  # without ReLUs the net is one matrix
    assert linear.losses[0] == pytest.approx(float(((product @ x - y_star) ** 2).sum() / (2 * x.shape[1])), rel=1e-12)
    relu = train_from_init(x, y_star, ws, steps=1, eta=1e-2, rule="constant", log_every=1)
    assert relu.losses[0] == pytest.approx(float(mse_loss(ws, x, y_star)), rel=1e-12)
    assert relu.losses[0] != pytest.approx(linear.losses[0], rel=1e-6)  # the ReLUs are active on this problem


def _euler_flow_norm(theta, x, g, dt, steps, relu):
    for _ in range(steps):  # explicit Euler on d theta / dt = -grad L_0(theta)
        _, grads = local_loss_gradient(theta, x, g, relu)
        theta = [w - dt * gr for w, gr in zip(theta, grads)]
    return float(parameter_norm(theta))


def _half_blow_up_dt(norm0, depth, s, steps):
    t_blow = norm0 ** (2 - depth) / ((depth - 2) * depth ** ((2 - depth) / 2) * s)
    return 0.5 * t_blow / steps  # at half the blow-up time the norm has grown by sqrt(2) (L = 4)


def test_norm_growth_formula_matches_simulated_flow_exactly_on_the_ray():
    """Deep linear net: the escape direction is known in closed form (a rank-1 chain on the top singular pair of
    G X^T), an exact fixed point, so only Euler's O(dt) error separates flow and formula."""
    x, g, _, _ = _problem(7, d0=4, n=30, d_out=2, widths=(6, 6))
    u, sv, vh = torch.linalg.svd(g @ x.T)
    gen = torch.Generator().manual_seed(0)
    chain = [vh[0]] + [torch.randn(6, generator=gen, dtype=torch.float64) for _ in range(2)] + [-u[:, 0]]
    chain = [c / c.norm() for c in chain]
    rho = [chain[k + 1][:, None] @ chain[k][None, :] for k in range(3)]
    s = float(sv[0])
    assert -float(local_loss(rho, x, g, relu=False)) == pytest.approx(s, rel=1e3 * EPS)
    assert fixed_point_alignment(rho, x, g, relu=False) == pytest.approx(1.0, abs=1e3 * EPS)
    depth, norm0, steps = 3, 0.05, 4000
    dt = _half_blow_up_dt(norm0, depth, s, steps)
    got = _euler_flow_norm([w * (norm0 / math.sqrt(depth)) for w in rho], x, g, dt, steps, relu=False)
    predicted = float(norm_growth(steps * dt, norm0, depth, s))
    assert predicted == pytest.approx(2 * norm0, rel=1e-12)  # L = 3: norm^-1 halves at half the blow-up time
    assert got == pytest.approx(predicted, rel=1e-3)  # forward Euler on a blow-up ODE: O(dt) relative error
    assert float(norm_growth(1.0, 2.0, 2, 0.5)) == pytest.approx(2.0 * math.exp(0.5), rel=1e-15)  # L = 2


def test_norm_growth_formula_matches_simulated_flow_relu():
    x, g, _, gen = _problem(4, d0=6, n=60, d_out=2, widths=(8, 8, 8))
    rho = optimal_escape_direction(x, g, [6, 8, 8, 8, 2], steps=1500, restarts=2, generator=gen)
    assert rho.alignment > 0.999
    depth, norm0, steps = 4, 0.05, 4000
    dt = _half_blow_up_dt(norm0, depth, rho.speed, steps)
    got = _euler_flow_norm([w * (norm0 / math.sqrt(depth)) for w in rho.weights], x, g, dt, steps, relu=True)
    predicted = float(norm_growth(steps * dt, norm0, depth, rho.speed))
    assert predicted == pytest.approx(math.sqrt(2) * norm0, rel=1e-12)
    # Euler's O(dt) error plus the direction's residual misalignment (it drifts towards faster escape)
    assert got == pytest.approx(predicted, rel=5e-3)


def test_small_init_training_escapes_with_a_low_rank_deep_layer():
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(8, 120, generator=gen, dtype=torch.float64)
    y_star = torch.relu(torch.randn(3, 1, generator=gen, dtype=torch.float64)) @ torch.relu(
        torch.randn(1, 8, generator=gen, dtype=torch.float64) @ x) + 0.1
    small = init_weights([8, 16, 16, 16, 3], 0.05, gen)
    big = init_weights([8, 16, 16, 16, 3], 1.0, gen, distribution="uniform")
    ts = train_from_init(x, y_star, small, 600, 0.02, steps_after_escape=0)
    tb = train_from_init(x, y_star, big, 600, 0.02, steps_after_escape=0)
    assert ts.escape_step is not None and tb.escape_step is not None
    assert ts.escape_step > tb.escape_step  # the plateau
    assert ts.losses[ts.escape_step] <= 0.98 * ts.zero_loss < ts.losses[ts.escape_step - 1]
    gs, gb = depth_gap(layer_ratios(ts.escape_weights)), depth_gap(layer_ratios(tb.escape_weights))
    assert gs > 1.0 > gb


def test_spectral_measures():
    u = torch.tensor([[1.0], [2.0], [2.0]], dtype=torch.float64)
    v = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    r1 = u @ v
    assert sigma_ratio(r1) == math.inf and rank_one_share(r1) == pytest.approx(1.0, abs=4 * EPS)
    d = torch.diag(torch.tensor([3.0, 1.0], dtype=torch.float64))
    assert sigma_ratio(d) == pytest.approx(3.0, rel=4 * EPS) and rank_one_share(d) == pytest.approx(0.9, rel=4 * EPS)
    assert deep_layers(6) == [4, 5, 6] and deep_layers(4) == [3, 4]
    assert depth_gap([1.0, 1.0, 1.0, 2.0, 3.0, 4.0]) == pytest.approx(min(2 / 4 ** 0.25, 3 / 5 ** 0.25, 4 / 6 ** 0.25))
    # a linear layer chain with positive inputs has no ReLU gap
    x = torch.rand(3, 10, dtype=torch.float64)
    assert relu_gap([torch.eye(3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64)], x) == [0.0]


def test_bad_input_is_rejected():
    x, g, ws, _ = _problem()
    with pytest.raises(RankwiseError, match="inputs"):
        local_loss(ws, x[:3], g)
    with pytest.raises(RankwiseError, match="takes"):
        local_loss([ws[0], ws[0]], x, g)
    with pytest.raises(RankwiseError, match="G must"):
        local_loss_gradient(ws, x, g[:2])
    with pytest.raises(RankwiseError, match="widths"):
        optimal_escape_direction(x, g, [4, 3], steps=1)
    with pytest.raises(RankwiseError, match="rule"):
        train_from_init(x, g, ws, 1, 0.1, rule="adam")
    with pytest.raises(RankwiseError, match="scale"):
        init_weights([2, 2], 0.0)
    with pytest.raises(RankwiseError, match="norm"):
        to_sphere([torch.zeros(2, 2)])
