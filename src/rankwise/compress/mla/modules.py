"""`LowRankLinear`: a k_proj / v_proj replaced by its two MLA factors, down-projection then up-projection.

`x -> up(down(x))` with down: D -> r (the latent a latent-KV cache would hold, r numbers per token) and up:
r -> kv_width. It drops into a Llama attention where `nn.Linear(D, kv_width)` was, so every other code path
(RoPE, repeat_kv, the KV cache) is untouched: in this one-shot form RoPE is applied *after* the up-projection,
exactly as in CARE's Table 1. A deployable latent cache needs a decoupled RoPE key, which is not done here.
"""

from __future__ import annotations

import torch
from torch import nn

from rankwise.errors import InvalidInputError


class LowRankLinear(nn.Module):
    """`up(down(x))`: down = Linear(in_features, rank, no bias), up = Linear(rank, out_features, bias optional).

    Input [..., in_features] -> output [..., out_features]. `down.weight` is [rank, in_features] and `up.weight`
    is [out_features, rank] (torch layout, as `core.linalg.LowRankFactors` holds them).
    """

    def __init__(self, in_features: int, rank: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        if not (in_features > 0 and out_features > 0 and rank > 0):
            raise InvalidInputError(f"LowRankLinear needs positive sizes, got in={in_features} rank={rank} out={out_features}")
        self.in_features, self.rank, self.out_features = in_features, rank, out_features
        self.down = nn.Linear(in_features, rank, bias=False)
        self.up = nn.Linear(rank, out_features, bias=bias)

    @classmethod
    def from_factors(cls, down: torch.Tensor, up: torch.Tensor, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> LowRankLinear:
        """Build from factors down [r, D] and up [out, r] (torch layout, up @ down = W; any float dtype; stored as `dtype`)."""
        if down.dim() != 2 or up.dim() != 2 or up.size(1) != down.size(0):
            raise InvalidInputError(f"factors must be down [r, D] and up [out, r], got {tuple(down.shape)} and {tuple(up.shape)}")
        module = cls(down.size(1), down.size(0), up.size(0), bias=bias is not None)
        with torch.no_grad():
            module.down.weight.copy_(down.to(dtype))
            module.up.weight.copy_(up.to(dtype))
            if bias is not None:
                module.up.bias.copy_(bias.to(dtype))
        return module.to(dtype)

    @property
    def weight(self) -> torch.Tensor:
        """The dense equivalent in nn.Linear layout [out_features, in_features] (for inspection, not used in forward)."""
        return self.up.weight @ self.down.weight

    def latent(self, x: torch.Tensor) -> torch.Tensor:
        """The rank-r code of each token: [..., in_features] -> [..., rank]."""
        return self.down(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, rank={self.rank}, out_features={self.out_features}, bias={self.up.bias is not None}"
