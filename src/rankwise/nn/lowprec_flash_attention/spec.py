"""The small instance and inputs the shared layer conformance test (`rankwise.nn.registry.LAYERS`) checks."""

from __future__ import annotations

import torch

from rankwise.nn.lowprec_flash_attention.layer import FlashAttention


def build(seed: int) -> FlashAttention:
    """Exact-arithmetic tiled attention (2 heads of size 8, causal, ragged tiles 4 x 3) with QK-norm gains drawn
    from `seed` (the parameters the check trains through the custom backward)."""
    torch.manual_seed(seed)
    layer = FlashAttention(8, num_heads=2, qk_norm=True, causal=True, tile_q=4, tile_k=3)
    with torch.no_grad():
        layer.q_gain.add_(0.1 * torch.randn_like(layer.q_gain))
        layer.k_gain.add_(0.1 * torch.randn_like(layer.k_gain))
    return layer


def inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [batch 2, heads 2, seq 11, head_dim 8]: a length no tile size divides."""
    return tuple(torch.randn(2, 2, 11, 8, generator=gen, dtype=dtype) for _ in range(3))  # type: ignore[return-value]


__all__ = ["build", "inputs"]
