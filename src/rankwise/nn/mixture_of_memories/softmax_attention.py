"""Causal softmax attention with the same projections, short convolutions and read-out as the linear layers.

The quadratic baseline MoM is compared with: x [batch, seq, d_model] -> [batch, seq, d_model],

    q, k, v = conv(x W_q), conv(x W_k), conv(x W_v)  (per head)   o = softmax(q k^T / sqrt(dk) + causal mask) v
    y = W_o concat_h RMSNorm(o)

The short convolutions give it the same access to the previous tokens as the linear layers (no positional
encoding is needed for associative recall then); time and memory grow as seq^2 where the linear layers grow as seq.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.nn.mixture_of_memories.checks import check_sequence, positive_int
from rankwise.nn.mixture_of_memories.linear_attention import HeadProjection, ReadOut


class CausalSoftmaxAttention(nn.Module):
    """Multi-head causal softmax attention: x [batch, seq, d_model] -> [batch, seq, d_model]."""

    def __init__(self, d_model: int, num_heads: int = 2, key_dim: int | None = None, value_dim: int | None = None,
                 conv_size: int = 4) -> None:
        super().__init__()
        self.d_model, self.num_heads = positive_int(d_model, "d_model"), positive_int(num_heads, "num_heads")
        self.key_dim = positive_int(key_dim if key_dim is not None else d_model // num_heads, "key_dim")
        self.value_dim = positive_int(value_dim if value_dim is not None else d_model // num_heads, "value_dim")
        if isinstance(conv_size, bool) or not isinstance(conv_size, int) or conv_size < 0:
            raise InvalidInputError(f"conv_size must be an int >= 0, got {conv_size!r}")
        self.q = HeadProjection(d_model, num_heads, self.key_dim, conv_size, activation=False)
        self.k = HeadProjection(d_model, num_heads, self.key_dim, conv_size, activation=False)
        self.v = HeadProjection(d_model, num_heads, self.value_dim, conv_size, activation=False)
        self.readout = ReadOut(num_heads, self.value_dim, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [batch, seq, d_model] -> [batch, seq, d_model]."""
        check_sequence(x, self.d_model, type(self).__name__)
        o = F.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), is_causal=True)
        return self.readout(o)


__all__ = ["CausalSoftmaxAttention"]
