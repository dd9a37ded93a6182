"""Frozen-prefix execution for the GuardSpace reproduction: adapters live only in the top layers of a causal LM, so the
hidden state entering the first adapted layer is a fixed function of the input. We compute it once per sequence
(`prefix`) and afterwards run only the top layers, the final norm and the LM head on it (`top`) — the same numbers as
a full forward (checked in the report), at a fraction of the cost on a CPU.

Works for transformers decoders whose backbone (`model.model`) has `layers`, `norm` and accepts `inputs_embeds`
(Llama, SmolLM2). Layers are swapped in and out per call, so the model is never left modified.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.repro.guardspace.data import Sequence_, pad_batch


class TopRunner:
    def __init__(self, model: nn.Module, start: int) -> None:
        self.model = model  # a *ForCausalLM (or an AdaptedModel around one)
        self.backbone = model.model
        self.start = start

    @contextmanager
    def _layers(self, first: int, last: int | None, norm: bool) -> Iterator[None]:
        layers, final_norm = self.backbone.layers, self.backbone.norm
        self.backbone.layers = nn.ModuleList(list(layers)[first:last])
        if not norm:
            self.backbone.norm = nn.Identity()
        try:
            yield
        finally:
            self.backbone.layers, self.backbone.norm = layers, final_norm

    @torch.no_grad()
    def prefix(self, seqs: list[Sequence_], batch_size: int = 16) -> list[torch.Tensor]:
        """Hidden state entering layer `start`, per sequence: [T_i, D]."""
        out: list[torch.Tensor] = []
        with self._layers(0, self.start, norm=False):
            for i in range(0, len(seqs), batch_size):
                chunk = seqs[i : i + batch_size]
                ids = pad_batch([s.ids for s in chunk], 0)
                h = self.backbone(input_ids=ids).last_hidden_state
                out.extend(h[j, : len(s)].clone() for j, s in enumerate(chunk))
        return out

    def top(self, h: torch.Tensor) -> torch.Tensor:
        """Final hidden states [B, T, D] from prefix states h [B, T, D] (right-padded; causal, so no mask)."""
        with self._layers(self.start, None, norm=True):
            return self.backbone(inputs_embeds=h).last_hidden_state

    def target_logits(self, h: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [M, V] at the M positions with a target (LM head applied only there), and those targets [M]."""
        final = self.top(h)
        where = targets != -100
        return self.model.lm_head(final[where]), targets[where]

    def loss(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits, y = self.target_logits(h, targets)
        return F.cross_entropy(logits, y)

    @torch.no_grad()
    def per_sequence_logits(self, hs: list[torch.Tensor], seqs: list[Sequence_], batch_size: int = 16) -> list[torch.Tensor]:
        """For each sequence, logits [n_i, V] at its target positions, in order."""
        out: list[torch.Tensor] = []
        for i in range(0, len(seqs), batch_size):
            chunk = seqs[i : i + batch_size]
            final = self.top(pad_batch(hs[i : i + batch_size], 0.0))
            for j, s in enumerate(chunk):
                where = (s.targets != -100).nonzero().squeeze(1)
                out.append(self.model.lm_head(final[j, where]))
        return out
