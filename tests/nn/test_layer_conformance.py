"""One conformance test for every layer in `rankwise.nn.registry.LAYERS`, and tests that the check itself bites."""

import pytest
import torch
from torch import nn

from rankwise.errors import UnknownNameError
from rankwise.nn.conformance import ConformanceError, check_layer
from rankwise.nn.registry import LAYERS, LayerSpec, get_layer_spec


@pytest.mark.parametrize("spec", LAYERS, ids=[s.name for s in LAYERS])
def test_registered_layer_conforms(spec):
    check_layer(spec)


class _Gated(nn.Module):
    """A well-behaved reference layer: x [batch, dim] -> [batch, dim]."""

    def __init__(self, dim: int, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(dim, dim, generator=g) / dim**0.5)
        self.register_buffer("scale", torch.full((dim,), 0.5))

    def forward(self, x):
        return torch.tanh(x @ self.w.T) * self.scale


def _inputs(gen, dtype):
    return (torch.randn(3, 8, generator=gen, dtype=dtype),)


def _spec(layer_cls, **kw):
    return LayerSpec(layer_cls.__name__, "lrnn", lambda seed: layer_cls(8, seed), _inputs, **kw)


def test_reference_layer_passes():
    check_layer(_spec(_Gated))


class _StatefulBetweenCalls(_Gated):
    def forward(self, x):
        self.scale.add_(1.0)  # hidden state: each call changes the next
        return super().forward(x)


class _StateOutsideStateDict(_Gated):
    def __init__(self, dim, seed):
        super().__init__(dim, seed)
        self.offset = torch.full((dim,), float(seed))  # a plain attribute: lost by state_dict

    def forward(self, x):
        return super().forward(x) + self.offset


class _DeadParameter(_Gated):
    def __init__(self, dim, seed):
        super().__init__(dim, seed)
        self.unused = nn.Parameter(torch.ones(dim))


class _StuckInFloat32(_Gated):
    def forward(self, x):
        return super().forward(x).float()


@pytest.mark.parametrize("layer_cls, message", [
    (_StatefulBetweenCalls, "differ"),
    (_StateOutsideStateDict, "state_dict"),
    (_DeadParameter, "unused"),
    (_StuckInFloat32, "float64"),
    (lambda dim, seed: (_ for _ in ()).throw(ValueError("boom")), "crashed"),
])
def test_check_catches_broken_layers(layer_cls, message):
    with pytest.raises(ConformanceError, match=message):
        check_layer(_spec(layer_cls))


def test_frozen_parameters_may_lack_gradients():
    check_layer(_spec(_DeadParameter, frozen=("unused",)))


def test_unknown_layer_name():
    with pytest.raises(UnknownNameError, match="registered"):
        get_layer_spec("no-such-layer")
