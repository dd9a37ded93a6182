"""A BERT-style encoder's top layers on cached inputs, mean-pooled into a linear head: what experiments that adapt
only the top layers of MiniLM train (the layers below are a fixed function of the text, computed once and cached by
`training.cached_classification`, the encoder part of `training.prefix_cache`)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from rankwise.models.minilm import mean_pool


class EncoderTopClassifier(nn.Module):
    """Encoder layers on cached inputs h [B, T, D] (mask [B, T], 1 = token) -> mean pool -> linear head [B, C].

    `shared`: parameters the layers use but do not own (e.g. CoA-LoRA's configuration network), registered here so
    that an optimizer over this module's parameters sees them.
    """

    def __init__(self, layers: Iterable[nn.Module], hidden: int, num_labels: int, shared: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        if shared is not None:
            self.shared = shared
        self.head = nn.Linear(hidden, num_labels)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        additive = (1.0 - mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min  # BERT's extended mask
        for layer in self.layers:
            out = layer(h, attention_mask=additive)
            h = out[0] if isinstance(out, tuple) else out
        return self.head(mean_pool(h, mask))
