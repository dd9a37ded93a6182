"""Frozen-prefix execution, the decoder part of the prefix cache (`training.prefix_cache`): when only the top layers of
a causal LM are adapted, the hidden state entering the first adapted layer is a fixed function of the input. Compute
it once per sequence (`prefix`: the inputs of layer `start`, the forward stopped there) and afterwards run only the
top layers, the final norm and the LM head on it (`top`): the same numbers as a full forward, at a fraction of the
cost on a CPU.

    runner = FrozenPrefixRunner(model, start=n_layers - 8)
    hs = runner.prefix([ids_1, ids_2])                  # [T_i, D] each, computed once
    loss = runner.loss(pad_batch(hs, 0.0), pad_batch([targets_1, targets_2], IGNORE_INDEX))

Works for transformers decoders whose backbone (`model.model`) has `layers`, `norm` and accepts `inputs_embeds`
(Llama, SmolLM2, ...). Sequences are token ids [T_i]; targets [T_i] hold, at position t, the token position t must
predict or `IGNORE_INDEX` where no loss is taken. Batches are right-padded: causal attention never looks right, so
no mask is needed. For `top` the layers are swapped in and out per call, so the model is never left modified.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.core.padding import pad_batch
from rankwise.errors import InvalidInputError
from rankwise.training.prefix_cache import batches, module_inputs

IGNORE_INDEX = -100  # a target position without loss (as torch's cross_entropy and transformers use)


class FrozenPrefixRunner:
    """Run a causal LM from the hidden state entering layer `start` (layers below it are frozen and run once)."""

    def __init__(self, model: nn.Module, start: int) -> None:
        backbone = getattr(model, "model", None)
        if not all(hasattr(backbone, a) for a in ("layers", "norm")) or not hasattr(model, "lm_head"):
            raise InvalidInputError("frozen-prefix execution needs a decoder with model.model.layers, model.model.norm and model.lm_head")
        if not 0 <= start < len(backbone.layers):
            raise InvalidInputError(f"start must be a layer index in 0..{len(backbone.layers) - 1}, got {start}")
        self.model = model  # a *ForCausalLM (or an AdaptedModel around one)
        self.backbone = backbone
        self.start = start

    @contextmanager
    def _top_layers(self) -> Iterator[None]:
        """The backbone holding only layers start.. for the block (then its own list again)."""
        layers = self.backbone.layers
        self.backbone.layers = nn.ModuleList(list(layers)[self.start :])
        try:
            yield
        finally:
            self.backbone.layers = layers

    @torch.no_grad()
    def prefix(self, ids: Sequence[torch.Tensor], batch_size: int = 16) -> list[torch.Tensor]:
        """Hidden state entering layer `start`, per sequence of token ids [T_i]: [T_i, D]."""
        out: list[torch.Tensor] = []
        first = self.backbone.layers[self.start]
        for part in batches(len(ids), batch_size):
            chunk = ids[part]
            h = module_inputs(first, partial(self.backbone, input_ids=pad_batch(chunk, 0))).first()
            out.extend(h[j, : s.numel()].clone() for j, s in enumerate(chunk))
        return out

    def top(self, h: torch.Tensor) -> torch.Tensor:
        """Final hidden states [B, T, D] from prefix states h [B, T, D] (right-padded; causal, so no mask)."""
        with self._top_layers():
            return self.backbone(inputs_embeds=h).last_hidden_state

    def target_logits(self, h: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [M, V] at the M positions with a target (LM head applied only there), and those targets [M]."""
        final = self.top(h)
        where = targets != IGNORE_INDEX
        return self.model.lm_head(final[where]), targets[where]

    def loss(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the target positions of prefix states h [B, T, D] and targets [B, T]."""
        logits, y = self.target_logits(h, targets)
        return F.cross_entropy(logits, y)

    @torch.no_grad()
    def per_sequence_logits(self, hs: Sequence[torch.Tensor], targets: Sequence[torch.Tensor], batch_size: int = 16) -> list[torch.Tensor]:
        """For each sequence (prefix states [T_i, D], targets [T_i]), logits [n_i, V] at its target positions, in order."""
        if len(hs) != len(targets):
            raise InvalidInputError(f"got {len(hs)} prefix states for {len(targets)} target sequences")
        out: list[torch.Tensor] = []
        for i in range(0, len(hs), batch_size):
            final = self.top(pad_batch(hs[i : i + batch_size], 0.0))
            for j, t in enumerate(targets[i : i + batch_size]):
                where = (t != IGNORE_INDEX).nonzero().squeeze(1)
                out.append(self.model.lm_head(final[j, where]))
        return out
