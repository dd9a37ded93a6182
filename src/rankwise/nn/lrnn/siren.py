"""SIREN, the sine-activated MLP that LRNN is compared against as an implicit neural representation.

    x [..., in] -> sin(omega0 (W_1 x + b_1)) -> sin(omega0 (W_k h + b_k)) ... -> Linear -> [..., out]

Initialisation as in the SIREN paper: first layer W ~ U(-1/in, 1/in); hidden layers W ~ U(-sqrt(6/n)/omega0, +),
so that omega0 W h has unit-order scale; the output layer is linear (same hidden-layer bound, without omega0).
`activation="spder"` is the SPDER baseline: the same network and init with sin(x) sqrt|x| in place of sin(x),
applied to the same pre-activation omega0 (W h + b) (unit-order in the hidden layers, so the damping acts there).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rankwise.nn.lrnn.activations import get_activation
from rankwise.nn.lrnn.checks import check_features, check_positive


class Siren(nn.Module):
    """x [..., in_features] -> [..., out_features]; `depth` periodic layers of width `width`, then a linear layer.

    `activation`: "sine" (SIREN) or any name of `nn.lrnn.activations` ("spder": the SPDER network)."""

    def __init__(self, in_features: int, out_features: int, width: int = 96, depth: int = 3, omega0: float = 30.0,
                 hidden_omega0: float = 30.0, activation: str = "sine") -> None:
        super().__init__()
        check_positive(in_features=in_features, out_features=out_features, width=width, depth=depth)
        self.activation, self._sigma = activation, get_activation(activation)
        self.in_features, self.omega0, self.hidden_omega0 = in_features, float(omega0), float(hidden_omega0)
        widths = (in_features, *([width] * depth))
        self.hidden = nn.ModuleList(nn.Linear(widths[k], widths[k + 1]) for k in range(depth))
        self.out = nn.Linear(width, out_features)
        with torch.no_grad():
            for k, lin in enumerate(self.hidden):
                bound = 1.0 / in_features if k == 0 else math.sqrt(6.0 / widths[k]) / self.hidden_omega0
                lin.weight.uniform_(-bound, bound)
            bound = math.sqrt(6.0 / width) / self.hidden_omega0
            self.out.weight.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> [..., out_features]."""
        h = check_features(x, self.in_features, type(self).__name__)
        for k, lin in enumerate(self.hidden):
            h = self._sigma((self.omega0 if k == 0 else self.hidden_omega0) * lin(h))
        return self.out(h)


def siren_parameter_count(in_features: int, out_features: int, width: int = 96, depth: int = 3) -> int:
    """Parameters of `Siren`: (in + 1) w + (depth - 1)(w + 1) w + (w + 1) out."""
    return (in_features + 1) * width + (depth - 1) * (width + 1) * width + (width + 1) * out_features
