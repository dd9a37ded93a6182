"""Mixture-of-Memories (MoM, ICLR 2026): a linear-attention token mixer with several routed memory states.

- `LinearAttention`: the single-memory base layer (decayed linear attention, chunked and recurrent forms).
- `MixtureOfMemories`: the MoM layer over it (router, top-k memories, shared memory).
- `load_balancing_loss`: the router's auxiliary loss over the router logits of all layers.
- `CausalSoftmaxAttention`: the quadratic baseline with the same projections.
- `linear_attention_chunked` / `linear_attention_recurrent`: the update rule itself.
"""

from rankwise.nn.mixture_of_memories.kernels import (
    linear_attention_chunked, linear_attention_recurrent, linear_attention_step,
)
from rankwise.nn.mixture_of_memories.layer import MixtureOfMemories
from rankwise.nn.mixture_of_memories.linear_attention import LinearAttention
from rankwise.nn.mixture_of_memories.router import Routing, TopKRouter, load_balancing_loss
from rankwise.nn.mixture_of_memories.softmax_attention import CausalSoftmaxAttention

__all__ = [
    "CausalSoftmaxAttention", "LinearAttention", "MixtureOfMemories", "Routing", "TopKRouter",
    "linear_attention_chunked", "linear_attention_recurrent", "linear_attention_step", "load_balancing_loss",
]
