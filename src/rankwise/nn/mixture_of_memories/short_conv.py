"""A causal depthwise short convolution over the sequence, in sequence and one-step forms.

Linear-attention layers put one after each q / k / v projection: it mixes each channel over the last few tokens, so
that a key written at a value's position can carry the preceding token (what associative recall needs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ShortConv(nn.Module):
    """y_t[c] = sum_{j < K} w[c, j] * x_{t-K+1+j}[c] (zeros before the sequence starts); x, y [batch, seq, channels].

    The last tap (j = K-1, the current token) starts at 1 and the others at 0, so a fresh layer is the identity.
    """

    def __init__(self, channels: int, kernel_size: int) -> None:
        super().__init__()
        self.kernel_size = int(kernel_size)
        weight = torch.zeros(channels, self.kernel_size)
        weight[:, -1] = 1.0
        self.weight = nn.Parameter(weight + 0.02 * torch.randn(channels, self.kernel_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [batch, seq, channels] -> [batch, seq, channels]."""
        xt = F.pad(x.transpose(1, 2), (self.kernel_size - 1, 0))
        return F.conv1d(xt, self.weight.unsqueeze(1), groups=self.weight.shape[0]).transpose(1, 2)

    def init_cache(self, batch: int, like: torch.Tensor) -> torch.Tensor:
        """The state of `step` before the first token: [batch, channels, K - 1] zeros."""
        return like.new_zeros(batch, self.weight.shape[0], self.kernel_size - 1)

    def step(self, x_t: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x_t [batch, channels], cache [batch, channels, K - 1] -> (y_t [batch, channels], new cache)."""
        window = torch.cat([cache, x_t.unsqueeze(-1)], dim=-1)  # [B, C, K], oldest first
        return (window * self.weight).sum(-1), window[..., 1:]


__all__ = ["ShortConv"]
