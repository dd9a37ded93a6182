"""Per-layer low-rank measures of the paper's Theorem 3.1, all in float64.

For a matrix M (a weight W_l [out, in] or activations Z_l^s [d_l, N]) with singular values s_1 >= s_2 >= ...:
- `sigma_ratio` s_1 / s_2 (the theorem gives s_1 / s_2 >~ l^(1/4) for layer l of the optimal escape direction);
- `rank_one_share` s_1^2 / sum_i s_i^2 (1 minus the O(l^(-1/2)) residual share of the theorem);
- `relu_gap` ||Z_l^s - Z_l||_F^2 / ||Z_l||_F^2 (ReLU acts almost as the identity in deep layers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from rankwise.algorithms.escape_directions.network import check_weights, forward


def singular_values(m: torch.Tensor, k: int | None = None) -> torch.Tensor:
    """The (top-k) singular values of a 2-D tensor, float64, descending."""
    s = torch.linalg.svdvals(m.detach().to(torch.float64))
    return s if k is None else s[:k]


def sigma_ratio(m: torch.Tensor) -> float:
    """s_1 / s_2 (inf for an exactly rank-1 matrix, nan for a zero one)."""
    s = singular_values(m)
    if s.numel() < 2 or s[1] == 0:
        return math.inf if s.numel() and s[0] > 0 else math.nan
    return float(s[0] / s[1])


def rank_one_share(m: torch.Tensor) -> float:
    """s_1^2 / ||M||_F^2: the energy of the best rank-1 approximation."""
    s = singular_values(m)
    total = float((s * s).sum())
    return float(s[0] ** 2) / total if total > 0 else math.nan


def layer_ratios(weights: Sequence[torch.Tensor]) -> list[float]:
    """s_1 / s_2 of every W_l, l = 1..L."""
    return [sigma_ratio(w) for w in check_weights(weights)]


def layer_shares(weights: Sequence[torch.Tensor]) -> list[float]:
    """Rank-1 energy share of every W_l."""
    return [rank_one_share(w) for w in check_weights(weights)]


def activation_shares(weights: Sequence[torch.Tensor], x: torch.Tensor) -> list[float]:
    """Rank-1 energy share of the hidden activations Z_l^s, l = 1..L-1."""
    _, post = forward(weights, x)
    return [rank_one_share(a) for a in post]


def relu_gap(weights: Sequence[torch.Tensor], x: torch.Tensor) -> list[float]:
    """||Z_l^s - Z_l||_F^2 / ||Z_l||_F^2 for hidden layers l = 1..L-1."""
    pre, post = forward(weights, x)
    out = []
    for z, a in zip(pre[:-1], post):
        denom = float((z.double() ** 2).sum())
        out.append(float(((a.double() - z.double()) ** 2).sum()) / denom if denom > 0 else math.nan)
    return out


def deep_layers(depth: int) -> list[int]:
    """The 'deeper layers' the claims read: l = floor(L/2) + 1, ..., L (1-based), e.g. 4, 5, 6 of L = 6."""
    return list(range(depth // 2 + 1, depth + 1))


def depth_gap(ratios: Sequence[float], layers: Sequence[int] | None = None) -> float:
    """min over layers l (1-based; default the deeper half) of (s_1 / s_2)(W_l) / l^(1/4); >= 1 is the theorem's gap."""
    layers = deep_layers(len(ratios)) if layers is None else list(layers)
    return min(ratios[l - 1] / l ** 0.25 for l in layers)
