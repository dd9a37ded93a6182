"""The testbed's model: MiniLM (frozen) with PEFT LoRA r=8 on query/value of its top layers and one head per task
on the mean-pooled output. Training runs only the adapted top layers on cached inputs (the layers below are a fixed
function of the text, `training.cached_classification`); the trigger scan runs the whole model from token ids.
"""

from __future__ import annotations

import copy

import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from rankwise.models.minilm import mean_pool

RANK, ALPHA = 8, 16
NUM_TOPICS = 12


def lora_minilm(base: nn.Module, top: int, seed: int) -> nn.Module:
    """A copy of `base` with LoRA (r=8, alpha=16, no dropout) on query/value of its `top` highest layers."""
    layers = len(base.encoder.layer)
    torch.manual_seed(seed)
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=["query", "value"],
                        layers_to_transform=list(range(layers - top, layers)))
    return get_peft_model(copy.deepcopy(base), config)


def encoder_layers(peft_model: nn.Module) -> nn.ModuleList:
    return peft_model.base_model.model.encoder.layer


class Heads(nn.Module):
    """Pooled features [B, D] -> (topic logits [B, 12], flip logits [B, 2], digits [B])."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.topic, self.flip, self.digits = nn.Linear(hidden, NUM_TOPICS), nn.Linear(hidden, 2), nn.Linear(hidden, 1)

    def forward(self, pooled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.topic(pooled), self.flip(pooled), self.digits(pooled).squeeze(-1)


class MultiTaskTop(nn.Module):
    """The adapted top layers on cached inputs h [B, T, D] (mask [B, T]) -> Heads' three outputs."""

    def __init__(self, layers: list[nn.Module], heads: Heads) -> None:
        super().__init__()
        self.layers, self.heads = nn.ModuleList(layers), heads

    def forward(self, h: torch.Tensor, mask: torch.Tensor):
        additive = (1.0 - mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        for layer in self.layers:
            out = layer(h, attention_mask=additive)
            h = out[0] if isinstance(out, tuple) else out
        return self.heads(mean_pool(h, mask))


class TopicClassifier(nn.Module):
    """The whole model from token ids: encoder (with its adapter, or inside disable_adapter() for the base) -> T1
    logits [B, 12]; what the trigger scan compares."""

    def __init__(self, peft_model: nn.Module, heads: Heads, adapter_on: bool) -> None:
        super().__init__()
        self.peft_model, self.heads, self.adapter_on = peft_model, heads, adapter_on

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.adapter_on:
            h = self.peft_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        else:
            with self.peft_model.disable_adapter():
                h = self.peft_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.heads(mean_pool(h, attention_mask))[0]
