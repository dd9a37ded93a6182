"""One low-rank separated (product) layer: each output neuron is a product of learnable univariate components.

    z^l = W^l x + b^l                                  [D] per neuron l (one Linear(in, r * D), reshaped)
    y_l = prod_{j<D} (1 + gamma * g^l_j(z^l_j))        gamma = D^(-1/2) by default (the card's variance control)
    y   = LayerNorm(y)                                 optional; the card: deep nets need it after every product

Fixed-activation mode (`fixed_activation="tanh"`, say) replaces each factor (1 + gamma g) by a fixed sigma(z): with
D = 1 and no LayerNorm the layer is exactly `sigma(Linear(x))`, an MLP layer.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.nn.lrnn.activations import get_activation
from rankwise.nn.lrnn.checks import check_features, check_positive
from rankwise.nn.lrnn.components import UnivariateComponents, component_parameter_count


class LowRankSeparatedLayer(nn.Module):
    """x [..., in_features] -> [..., rank]: `rank` product neurons of `proj_dim` learnable components each.

    Args:
        in_features: input width. rank: output width r (neurons). proj_dim: D, components per neuron.
        hidden: width h of each component MLP. activation: the components' sigma (see `activations.ACTIVATIONS`).
        omega0: frequency scale inside the components (30 on a first layer over coordinates, as in SIREN).
        gamma: factor scale; None = D^(-1/2). layer_norm: LayerNorm(rank) after the product.
        shared_components: one set of D components for all neurons (projections stay per neuron).
        fixed_activation: if set, no learnable components: each factor is this fixed sigma(z).
    """

    def __init__(self, in_features: int, rank: int, proj_dim: int = 8, hidden: int = 4, activation: str = "sine",
                 omega0: float = 1.0, gamma: float | None = None, layer_norm: bool = True,
                 shared_components: bool = False, fixed_activation: str | None = None) -> None:
        super().__init__()
        check_positive(in_features=in_features, rank=rank, proj_dim=proj_dim, hidden=hidden)
        if gamma is not None and not (isinstance(gamma, (int, float)) and math.isfinite(gamma)):
            raise InvalidInputError(f"gamma must be a finite number or None, got {gamma!r}")
        self.in_features, self.rank, self.proj_dim = in_features, rank, proj_dim
        self.gamma = proj_dim ** -0.5 if gamma is None else float(gamma)
        self.projection = nn.Linear(in_features, rank * proj_dim)
        self.fixed_activation = fixed_activation
        if fixed_activation is None:
            self.components: UnivariateComponents | None = UnivariateComponents(
                rank, proj_dim, hidden, activation, omega0, shared_components)
            self._fixed = None
        else:
            self.components = None
            self._fixed = get_activation(fixed_activation)
        self.norm = nn.LayerNorm(rank) if layer_norm else None

    def factors(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> the factors [..., rank, proj_dim] whose product over the last axis is the output."""
        z = self.projection(x).unflatten(-1, (self.rank, self.proj_dim))
        if self.components is None:
            return self._fixed(z)
        return 1.0 + self.gamma * self.components(z)

    def forward_unchecked(self, x: torch.Tensor) -> torch.Tensor:
        """`forward` without the input checks (for callers that checked already, e.g. `LRNN`)."""
        y = self.factors(x).prod(-1)
        return y if self.norm is None else self.norm(y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> [..., rank]."""
        return self.forward_unchecked(check_features(x, self.in_features, type(self).__name__))

    def extra_repr(self) -> str:
        mode = f"fixed_activation={self.fixed_activation!r}" if self.components is None else f"gamma={self.gamma:.4g}"
        return f"in_features={self.in_features}, rank={self.rank}, proj_dim={self.proj_dim}, {mode}"


def layer_parameter_count(in_features: int, rank: int, proj_dim: int = 8, hidden: int = 4, layer_norm: bool = True,
                          shared_components: bool = False, fixed_activation: str | None = None) -> int:
    """Parameters of `LowRankSeparatedLayer`: projection (in + 1) r D, components, LayerNorm 2 r."""
    n = (in_features + 1) * rank * proj_dim
    if fixed_activation is None:
        n += component_parameter_count(rank, proj_dim, hidden, shared_components)
    return n + (2 * rank if layer_norm else 0)
