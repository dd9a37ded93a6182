"""The small instance and inputs the shared layer conformance test (`rankwise.nn.registry.LAYERS`) checks."""

from __future__ import annotations

import torch

from rankwise.nn.mixture_of_memories.layer import MixtureOfMemories


def build(seed: int) -> MixtureOfMemories:
    """A small MoM (d_model 16, 2 heads, 4 memories, top-2, shared memory, decay, chunks of 4) from `seed`."""
    torch.manual_seed(seed)
    return MixtureOfMemories(16, num_heads=2, num_memories=4, top_k=2, shared_memory=True, decay="retnet",
                             chunk_size=4)


def inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor]:
    """x [batch 2, seq 11, d_model 16]: a sequence that is not a multiple of the chunk length."""
    return (torch.randn(2, 11, 16, generator=gen, dtype=dtype),)


__all__ = ["build", "inputs"]
