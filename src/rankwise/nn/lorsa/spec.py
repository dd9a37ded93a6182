"""The small Lorsa the shared layer conformance test builds (`rankwise.nn.registry.LAYERS`)."""

from __future__ import annotations

import torch

from rankwise.nn.lorsa.config import LorsaConfig
from rankwise.nn.lorsa.layer import Lorsa
from rankwise.nn.lorsa.rope import Rope

# RoPE on every QK dim: without it b_K is a softmax no-op and would (rightly) get no gradient.
CONFIG = LorsaConfig(d_model=12, n_qk=2, n_ov=8, d_qk=4, k=3, rope=Rope(4, 1e4))


def build(seed: int) -> Lorsa:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        layer = Lorsa(CONFIG)
        with torch.no_grad():  # nonzero biases, so a round trip that drops them shows
            for b in (layer.b_Q, layer.b_K, layer.b_V, layer.b_O):
                b.normal_(std=0.1)
    return layer


def inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 6, CONFIG.d_model, generator=gen, dtype=dtype),)
