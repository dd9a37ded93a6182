"""The STE baseline of quantized-relu-training: straight-through gradients, verifier-counted errors, seeded runs."""

import numpy as np
import pytest
import torch

from rankwise.algorithms.quantized_relu import QuantizedArchitecture, count_errors, planted_instance, z_d
from rankwise.algorithms.quantized_relu.ste import _quantize, ste_train
from rankwise.errors import InvalidInputError

pytestmark = pytest.mark.method("quantized-relu-training")
ARCH = QuantizedArchitecture(inputs=3, hidden=(2,), outputs=1, d=2)


def test_quantize_rounds_into_z_d_and_passes_the_gradient_straight_through():
    latent = torch.tensor([-2.3, -0.4, 0.49, 0.51, 1.7, 9.0], dtype=torch.float64, requires_grad=True)
    lo, hi = int(z_d(3)[0]), int(z_d(3)[-1])
    q = _quantize(latent, lo, hi)
    assert q.tolist() == [-1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    (q * torch.arange(6.0, dtype=torch.float64)).sum().backward()
    assert latent.grad.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # identity, clipped values included


def test_reported_errors_are_the_verifiers_and_runs_are_seeded():
    _, x, y = planted_instance(ARCH, 300, np.random.default_rng(1))
    a = ste_train(ARCH, x, y, seeds=4, steps=100, check_every=20, seed=3)
    b = ste_train(ARCH, x, y, seeds=4, steps=100, check_every=20, seed=3)
    assert a.errors == b.errors and all(np.array_equal(p.parameters(), q.parameters()) for p, q in zip(a.networks, b.networks))
    assert a.errors == [count_errors(net, x, y) for net in a.networks]
    assert a.success_rate == np.mean([e == 0 for e in a.errors])
    assert all(np.isin(net.parameters(), z_d(2)).all() for net in a.networks)


def test_training_lowers_the_error_below_the_random_start():
    _, x, y = planted_instance(ARCH, 300, np.random.default_rng(2))
    start = ste_train(ARCH, x, y, seeds=8, steps=1, check_every=1, seed=0)
    trained = ste_train(ARCH, x, y, seeds=8, steps=300, check_every=50, seed=0)
    assert np.mean(trained.errors) < np.mean(start.errors)


def test_bad_settings_are_refused():
    _, x, y = planted_instance(ARCH, 10, np.random.default_rng(0))
    with pytest.raises(InvalidInputError):
        ste_train(ARCH, x, y, seeds=0)
    with pytest.raises(InvalidInputError):
        ste_train(ARCH, x, y, lr=0.0)
