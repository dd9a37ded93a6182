"""`core.module_inputs.first_inputs`: the first input of each named module in one forward, and no hook left behind."""

import pytest
import torch
from torch import nn

from rankwise.core.module_inputs import first_inputs


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def test_first_input_of_each_module_and_only_the_first():
    net, x = _net(), torch.randn(5, 4)
    seen = first_inputs({"a": net[0], "b": net[2]}, lambda: (net(x), net(2 * x)))
    assert torch.equal(seen["a"], x)  # the first call's input, not the second's
    assert torch.equal(seen["b"], torch.relu(net[0](x)).detach())
    assert not seen["b"].requires_grad


def test_keep_and_unreached_modules():
    net, x = _net(), torch.randn(5, 4)
    unused = nn.Linear(2, 2)
    seen = first_inputs({"a": net[0], "unused": unused}, lambda: net(x), keep=lambda t: tuple(t.shape))
    assert seen == {"a": (5, 4)}


def test_hooks_removed_even_when_the_forward_fails():
    net = _net()

    def failing():
        net(torch.randn(1, 4))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        first_inputs({"a": net[0]}, failing)
    assert not net[0]._forward_pre_hooks
