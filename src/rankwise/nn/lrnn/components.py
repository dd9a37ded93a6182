"""The learnable univariate components g of an LRNN layer: many tiny one-hidden-layer MLPs evaluated as one tensor op.

For rank r (neurons) and projection dimension D, there are r * D scalar functions (or D when shared across
neurons), each  g(t) = sum_{m<h} a_m * sigma(omega0 * (u_m * t + c_m)) + e  with its own u, c, a [h] and e.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rankwise.nn.lrnn.activations import get_activation


class UnivariateComponents(nn.Module):
    """`rank x proj_dim` independent scalar MLPs of width `hidden` (one row of them when `shared`).

    Parameters: u, c, a [G, proj_dim, hidden] and e [G, proj_dim], G = 1 if shared else rank.
    Init (card, Lemma 1): zero-mean g with u ~ U(-1, 1), c ~ U(-pi, pi), a ~ N(0, 1/hidden), e = 0, so that with a
    periodic sigma each g has mean ~0 and variance ~E[sigma^2] over a random phase.
    """

    def __init__(self, rank: int, proj_dim: int, hidden: int, activation: str = "sine", omega0: float = 1.0,
                 shared: bool = False) -> None:
        super().__init__()
        self.rank, self.proj_dim, self.hidden, self.shared = rank, proj_dim, hidden, shared
        self.activation, self.omega0 = activation, float(omega0)
        self._sigma = get_activation(activation)
        groups = 1 if shared else rank
        self.u = nn.Parameter(torch.empty(groups, proj_dim, hidden))
        self.c = nn.Parameter(torch.empty(groups, proj_dim, hidden))
        self.a = nn.Parameter(torch.empty(groups, proj_dim, hidden))
        self.e = nn.Parameter(torch.zeros(groups, proj_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.u.uniform_(-1.0, 1.0)
            self.c.uniform_(-math.pi, math.pi)
            self.a.normal_(0.0, 1.0 / math.sqrt(self.hidden))
            self.e.zero_()

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """z [..., rank, proj_dim] -> g(z) [..., rank, proj_dim], each entry through its own component."""
        # omega0 (u z + c) with omega0 folded into the small [G, D, h] tensors, not the big [..., r, D, h] one
        pre = torch.addcmul(self.c * self.omega0, z.unsqueeze(-1), self.u * self.omega0)  # [..., rank, proj_dim, hidden]
        return (self._sigma(pre) * self.a).sum(-1) + self.e

    def extra_repr(self) -> str:
        return (f"rank={self.rank}, proj_dim={self.proj_dim}, hidden={self.hidden}, activation={self.activation!r}, "
                f"omega0={self.omega0:g}, shared={self.shared}")


def component_parameter_count(rank: int, proj_dim: int, hidden: int, shared: bool = False) -> int:
    """Parameters of `UnivariateComponents`: (3 h + 1) per component, r * D components (D when shared)."""
    return (1 if shared else rank) * proj_dim * (3 * hidden + 1)
