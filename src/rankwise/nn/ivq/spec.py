"""The small Magnet attention instance the shared layer conformance test checks (`rankwise.nn.registry.LAYERS`)."""

from __future__ import annotations

import torch
from torch import nn

from rankwise.nn.ivq.magnet import MagnetAttention


class MagnetPrototypes(nn.Module):
    """Magnet attention returning its prototypes only (the conformance check reads one tensor)."""

    def __init__(self, layer: MagnetAttention) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # [B, L, D] -> [B, K, D]
        return self.layer(z)[0]


def build(seed: int) -> MagnetPrototypes:
    """K = 3 queries in D = 4 (scaled down so the softmax is not one-hot and fp32 vs fp64 stays at rounding)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        layer = MagnetAttention(3, 4)
        with torch.no_grad():
            layer.queries.mul_(0.5)
        return MagnetPrototypes(layer)


def inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor]:
    """z [2, 5, 4]."""
    return (0.5 * torch.randn(2, 5, 4, generator=gen, dtype=dtype),)
