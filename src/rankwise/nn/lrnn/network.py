"""The (deep) low-rank separated network: product layers, LayerNorm after each, a linear read-out.

    x [..., in] -> LowRankSeparatedLayer(in, r_1) -> ... -> LowRankSeparatedLayer(r_{L-1}, r_L) -> Linear(r_L, out)

One layer without LayerNorm is the shallow LRNN  y = sum_l s_l prod_j (1 + gamma g^l_j(z^l_j)) + bias. As an implicit
neural representation it maps coordinates [..., d] to values [..., out]; as a classifier it returns logits
[..., classes] for cross-entropy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.nn.lrnn.checks import check_features, check_positive
from rankwise.nn.lrnn.layer import LowRankSeparatedLayer, layer_parameter_count


class LRNN(nn.Module):
    """x [..., in_features] -> [..., out_features] through product layers of widths `ranks`.

    Args:
        in_features, out_features: input and output widths.
        ranks: the width (separation rank) r_k of each product layer, e.g. (32, 32) for the card's 2-layer net.
        proj_dim: D, components per neuron (every layer). hidden: component MLP width.
        activation: component sigma ("sine", "spder", "sinarctan", "tanh", "identity").
        omega0: frequency scale of the first layer's components (over raw coordinates).
        hidden_omega0: frequency scale of later layers' components; None = omega0 (as SIREN's hidden layers).
        gamma: factor scale, None = D^(-1/2). layer_norm: LayerNorm after every product layer.
        shared_components: share each layer's D components across its neurons.
        fixed_activation: fixed-activation mode (see `LowRankSeparatedLayer`).
    """

    def __init__(self, in_features: int, out_features: int, ranks: Sequence[int] = (32, 32), proj_dim: int = 8,
                 hidden: int = 4, activation: str = "sine", omega0: float = 30.0, hidden_omega0: float | None = None,
                 gamma: float | None = None, layer_norm: bool = True, shared_components: bool = False,
                 fixed_activation: str | None = None) -> None:
        super().__init__()
        ranks = tuple(ranks)
        if not ranks:
            raise InvalidInputError("ranks must list at least one layer width")
        check_positive(in_features=in_features, out_features=out_features)
        self.in_features, self.out_features, self.ranks = in_features, out_features, ranks
        widths = (in_features, *ranks)
        self.layers = nn.ModuleList(
            LowRankSeparatedLayer(widths[k], widths[k + 1], proj_dim, hidden, activation,
                                  omega0 if k == 0 or hidden_omega0 is None else hidden_omega0, gamma, layer_norm,
                                  shared_components, fixed_activation)
            for k in range(len(ranks)))
        self.readout = nn.Linear(ranks[-1], out_features)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> the last product layer's output [..., r_L]."""
        h = check_features(x, self.in_features, type(self).__name__)
        for layer in self.layers:
            h = layer.forward_unchecked(h)
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> [..., out_features] (values for an INR, logits for a classifier)."""
        return self.readout(self.features(x))


def lrnn_parameter_count(in_features: int, out_features: int, ranks: Sequence[int] = (32, 32), proj_dim: int = 8,
                         hidden: int = 4, layer_norm: bool = True, shared_components: bool = False,
                         fixed_activation: str | None = None) -> int:
    """Parameters of `LRNN` with these arguments (the layers' counts plus the read-out's (r_L + 1) * out)."""
    widths = (in_features, *ranks)
    n = sum(layer_parameter_count(widths[k], widths[k + 1], proj_dim, hidden, layer_norm, shared_components,
                                  fixed_activation) for k in range(len(ranks)))
    return n + (ranks[-1] + 1) * out_features
