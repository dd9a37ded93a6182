"""Card invariants of quantized-relu-training: Z_d and ReLU_d, verifier vs deduplicated counts, DP = brute force."""

import itertools

import numpy as np
import pytest

from rankwise.algorithms.quantized_relu import (
    QuantizedArchitecture, QuantizedNetwork, brute_force, brute_force_assignments, count_errors, decide, deduplicate,
    estimate_dp_work, layer_dp, network_from_parameters, planted_instance, random_labels_instance, random_network,
    relu_d, smallest_sufficient_in_degree, z_d,
)
from rankwise.errors import RankwiseError

pytestmark = pytest.mark.method("quantized-relu-training")


def _random_arch(rng, d=None, max_assignments=1 << 14):
    while True:
        dd = int(rng.choice([2, 3])) if d is None else d
        hidden = tuple(int(rng.integers(1, 3)) for _ in range(int(rng.integers(0, 3))))
        arch = QuantizedArchitecture(int(rng.integers(1, 4)), hidden, int(rng.integers(1, 3)), dd,
                                     bias_sign=str(rng.choice(["subtract", "add"])))
        if brute_force_assignments(arch) <= max_assignments:
            return arch


@pytest.mark.parametrize("d", [2, 3, 4, 5])
def test_z_d_and_relu_d(d):
    values = z_d(d)
    assert values.size == d and np.all(np.diff(values) == 1)
    assert values[0] == -((d - 1) // 2) and values[-1] == -(-(d - 1) // 2)
    z = np.arange(-10, 11)
    out = relu_d(z, d)
    assert out.min() >= 0 and out.max() == values[-1] and np.all(np.isin(out, values))
    assert np.array_equal(relu_d(z, d, clip=False), np.maximum(z, 0))


def test_verifier_equals_deduplicated_count():
    rng = np.random.default_rng(0)
    for _ in range(30):
        arch = _random_arch(rng)
        net = random_network(arch, rng)
        x, y = random_labels_instance(arch, int(rng.integers(1, 60)), rng)
        data = deduplicate(arch, x, y)
        direct = int(np.any(net.forward(x) != y, axis=1).sum())
        assert count_errors(net, x, y) == direct == int(data.errors(net.forward(data.inputs)))
        assert data.p <= min(len(x), arch.d ** arch.inputs) and data.counts.sum() == len(x)


def test_duplicates_never_change_p_or_the_optimum():
    rng = np.random.default_rng(1)
    arch = QuantizedArchitecture(3, (2,), 1, 2)
    x, y = random_labels_instance(arch, 20, rng)
    once = layer_dp(arch, x, y)
    x2, y2 = np.concatenate([x, x]), np.concatenate([y, y])
    twice = layer_dp(arch, x2, y2)
    assert deduplicate(arch, x2, y2).p == deduplicate(arch, x, y).p
    assert twice.errors == 2 * once.errors


def test_planted_teacher_is_a_certificate_and_the_dp_finds_zero():
    rng = np.random.default_rng(2)
    for _ in range(20):
        arch = _random_arch(rng, max_assignments=1 << 30)
        teacher, x, y = planted_instance(arch, 200, rng)
        assert count_errors(teacher, x, y) == 0
        sol = layer_dp(arch, x, y)
        assert sol.errors == 0 and count_errors(sol.network, x, y) == 0
        assert decide(arch, x, y, 0)


def test_dp_equals_brute_force_on_random_instances():
    rng = np.random.default_rng(3)
    for k in range(60):
        arch = _random_arch(rng)
        if k % 2:
            _, x, y = planted_instance(arch, int(rng.integers(3, 30)), rng, flips=int(rng.integers(0, 4)))
        else:
            x, y = random_labels_instance(arch, int(rng.integers(3, 30)), rng)
        bf, dp = brute_force(arch, x, y), layer_dp(arch, x, y)
        assert dp.errors == bf.errors, arch
        assert count_errors(dp.network, x, y) == dp.errors
        assert count_errors(bf.network, x, y) == bf.errors
        assert dp.errors >= deduplicate(arch, x, y).lower_bound()


def test_dp_equals_brute_force_for_d4():
    """d = 4 (Z_4 = {-1, 0, 1, 2}): activations take three values, so clipping and coefficient sums differ from d <= 3."""
    rng = np.random.default_rng(8)
    for _ in range(25):
        arch = QuantizedArchitecture(1, (2,), 1, 4)
        x, y = random_labels_instance(arch, 12, rng)
        assert layer_dp(arch, x, y).errors == brute_force(arch, x, y).errors


def test_brute_force_is_the_true_minimum_by_enumeration():
    """Brute force against a plain loop over every assignment (network objects, no vectorisation)."""
    rng = np.random.default_rng(4)
    arch = QuantizedArchitecture(2, (1,), 1, 3)
    x, y = random_labels_instance(arch, 15, rng)
    values = z_d(arch.d)
    best = min(count_errors(network_from_parameters(arch, np.array(p)), x, y)
               for p in itertools.product(values, repeat=arch.n_params))
    assert brute_force(arch, x, y).errors == best


def test_label_flips_bound_the_optimum_and_decision_is_monotone():
    rng = np.random.default_rng(5)
    arch = QuantizedArchitecture(3, (2,), 1, 2)
    _, x, y = planted_instance(arch, 40, rng, flips=3)
    opt = layer_dp(arch, x, y).errors
    assert opt <= 3
    answers = [decide(arch, x, y, l) for l in range(6)]
    assert answers == [l >= opt for l in range(6)]


def test_inconsistent_labels_force_errors():
    arch = QuantizedArchitecture(1, (), 1, 2)
    x = np.array([[0], [0], [1]])
    y = np.array([[0], [1], [1]])
    sol = layer_dp(arch, x, y)
    assert sol.errors == 1 == deduplicate(arch, x, y).lower_bound()


def test_zeroing_weights_with_zero_contribution_keeps_activations():
    """The Lemma 1 operation: in-weights whose contribution vectors sum to zero can be dropped."""
    arch = QuantizedArchitecture(3, (1,), 1, 3)
    x = np.array(list(itertools.product(z_d(3), repeat=3)))
    # Inputs 0 and 1 are equal on these points, so w * x0 - w * x1 contributes zero on every point.
    x = x[x[:, 0] == x[:, 1]]
    net = QuantizedNetwork(arch, [np.array([[1, -1, 1]]), np.array([[1]])], [np.array([0]), np.array([0])])
    zeroed = QuantizedNetwork(arch, [np.array([[0, 0, 1]]), np.array([[1]])], [np.array([0]), np.array([0])])
    assert np.array_equal(net.forward(x), zeroed.forward(x))


def test_in_degree_restriction_is_monotone():
    rng = np.random.default_rng(6)
    arch = QuantizedArchitecture(3, (3,), 1, 2)
    _, x, y = planted_instance(arch, 100, rng, flips=2)
    errs = [layer_dp(arch, x, y, max_nonzero_in=k).errors for k in range(4)]
    assert all(a >= b for a, b in zip(errs, errs[1:])) and errs[-1] == layer_dp(arch, x, y).errors
    delta, sol = smallest_sufficient_in_degree(arch, x, y)
    assert sol.errors == errs[-1] and errs[delta] == errs[-1] and (delta == 0 or errs[delta - 1] > errs[-1])


def test_certificate_size_is_linear_in_parameters():
    for hidden in [(), (2,), (2, 3), (4, 4, 4)]:
        arch = QuantizedArchitecture(3, hidden, 2, 3)
        net = random_network(arch, np.random.default_rng(0))
        params = net.parameters()
        assert params.size == arch.n_params == sum(o * i + o for o, i in arch.layer_shapes)
        back = network_from_parameters(arch, params)
        assert all(np.array_equal(a, b) for a, b in zip(back.weights, net.weights))


def test_bias_sign_convention():
    arch = QuantizedArchitecture(1, (), 1, 3)
    sub = QuantizedNetwork(arch, [np.array([[1]])], [np.array([1])])
    add = QuantizedNetwork(QuantizedArchitecture(1, (), 1, 3, bias_sign="add"), [np.array([[1]])], [np.array([1])])
    x = np.array([[1], [0], [-1]])
    assert sub.forward(x).ravel().tolist() == [0, 0, 0]  # relu(x - 1)
    assert add.forward(x).ravel().tolist() == [1, 1, 0]  # min(relu(x + 1), 1)


def test_dp_work_does_not_depend_on_n_once_inputs_repeat():
    rng = np.random.default_rng(7)
    arch = QuantizedArchitecture(2, (2, 2), 1, 2)
    ops = []
    for n in (100, 10_000):
        _, x, y = planted_instance(arch, n, rng)
        ops.append(layer_dp(arch, x, y, early_stop=False).operations)
    assert ops[0] == ops[1]


def test_oversized_instances_are_refused_up_front():
    arch = QuantizedArchitecture(8, (4, 4, 4), 2, 3)
    x = np.array(list(itertools.product(z_d(3), repeat=8)))[:3000]
    y = np.zeros((len(x), 2), dtype=np.int64)
    assert estimate_dp_work(arch, 3000).candidates > 3_000_000
    with pytest.raises(RankwiseError, match="max_candidates"):
        layer_dp(arch, x, y)
    with pytest.raises(RankwiseError, match="max_assignments"):
        brute_force(arch, x, y)


def test_bad_input_is_rejected():
    arch = QuantizedArchitecture(2, (1,), 1, 2)
    with pytest.raises(RankwiseError, match="Z_2"):
        layer_dp(arch, np.array([[0, 2]]), np.array([[0]]))
    with pytest.raises(RankwiseError, match="labels"):
        layer_dp(arch, np.array([[0, 1]]), np.array([[0, 1]]))
    with pytest.raises(RankwiseError, match="integers"):
        layer_dp(arch, np.array([[0.5, 1.0]]), np.array([[0]]))
    with pytest.raises(RankwiseError, match="empty"):
        layer_dp(arch, np.zeros((0, 2), dtype=np.int64), np.zeros((0, 1), dtype=np.int64))
    with pytest.raises(RankwiseError):
        QuantizedArchitecture(0, (1,), 1, 2)
    with pytest.raises(RankwiseError):
        QuantizedArchitecture(2, (1,), 1, 1)
    with pytest.raises(RankwiseError, match="bias_sign"):
        QuantizedArchitecture(2, (1,), 1, 2, bias_sign="minus")
    with pytest.raises(RankwiseError, match="Z_2"):
        QuantizedNetwork(arch, [np.array([[2, 0]]), np.array([[1]])], [np.array([0]), np.array([0])])
