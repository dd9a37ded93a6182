"""The small LRNN instance the shared layer conformance test checks (`rankwise.nn.registry.LAYERS`)."""

from __future__ import annotations

import torch

from rankwise.nn.lrnn.network import LRNN


def build(seed: int) -> LRNN:
    """A 2-layer LRNN 3 -> (4, 4) -> 2, D = 3, width-2 components; moderate omega0 keeps fp32 vs fp64 at rounding."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LRNN(3, 2, ranks=(4, 4), proj_dim=3, hidden=2, omega0=2.0)


def inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor]:
    """x [5, 3]."""
    return (torch.randn(5, 3, generator=gen, dtype=dtype),)
