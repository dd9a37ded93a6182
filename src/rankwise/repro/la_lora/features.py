"""MiniLM's frozen prefix, cached (`training.prefix_cache`): LoRA sits on the top layer's FFN output projection
(`encoder.layer.5.output.dense`, 1536 -> 384), so everything below it is a fixed function of the text and is computed
once.

BertOutput computes LayerNorm(dense(x) + residual) with x the FFN's inner activation [T, 1536]. With the LoRA delta,
LayerNorm(W0 x + b + residual + s B A x): the frozen part z = W0 x + b + residual [T, 384] and x are cached per
example (BertOutput's inputs, the forward stopped there); the trained tail (`TopTail`) is the library's LoRA adapter
on that projection, the LayerNorm, mean pooling over the mask and the head.
`check_tail` compares the tail with the full MiniLM + LoRA forward (the invariant the report states).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.adapters import AdapterSite, LoraAdapter, LoraConfig, SharedParameters
from rankwise.models.minilm import mean_pool
from rankwise.training.prefix_cache import batches, chunks, module_inputs

TARGET = "encoder.layer.{last}.output.dense"


@torch.no_grad()
def cache_features(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, batch: int = 64) -> dict[str, torch.Tensor]:
    """{x [N, T, 1536], z [N, T, 384], attention_mask [N, T]} for token ids [N, T] (right-padded)."""
    out_layer = model.encoder.layer[model.config.num_hidden_layers - 1].output
    xs, zs = [], []
    for part in batches(ids.size(0), batch):
        x, residual = module_inputs(out_layer, partial(model, input_ids=ids[part], attention_mask=mask[part])).args[:2]
        xs.append(x)
        zs.append(F.linear(x, out_layer.dense.weight, out_layer.dense.bias) + residual)
    return {"x": torch.cat(xs), "z": torch.cat(zs), "attention_mask": mask.clone()}


def tail_lora(r: int, alpha: float, d_in: int, d_out: int) -> LoraAdapter:
    """The library's LoRA adapter (delta = (alpha / r) B A x) for a projection d_in -> d_out, with A drawn once
    (Kaiming-uniform, a = sqrt(5)) and B = 0: the committed reports' draw. `LoraConfig`'s "default" init follows
    PEFT's order (A, B, then A again), which would change every number after it. The projection's own output
    W0 x + b is cached in z, so the site holds only its shape (a weightless meta-device layer: no random draw)."""
    site = AdapterSite("output.dense", "output.dense", None, nn.Linear(d_in, d_out, device="meta"), "tail",
                       SharedParameters())
    lora = LoraAdapter(site, LoraConfig(r=r, lora_alpha=alpha, target_modules=["output.dense"]), initialize=False)
    nn.init.kaiming_uniform_(lora.A, a=math.sqrt(5))
    nn.init.zeros_(lora.B)
    return lora


class TopTail(nn.Module):
    """The trained part: LoRA on the top FFN output projection, its LayerNorm (frozen), mean pooling, a new head."""

    def __init__(self, layer_norm: nn.LayerNorm, r: int, alpha: float, d_in: int, num_labels: int) -> None:
        super().__init__()
        d = layer_norm.normalized_shape[0]
        self.norm = nn.LayerNorm(d, eps=layer_norm.eps)
        self.norm.load_state_dict(layer_norm.state_dict())
        self.norm.requires_grad_(False)
        self.lora = tail_lora(r, alpha, d_in, d)
        self.head = nn.Linear(d, num_labels)

    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.head(mean_pool(self.norm(batch["z"] + self.lora(batch["x"])), batch["attention_mask"]))


def tail_logits(module: TopTail, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return module(batch)


@torch.no_grad()
def accuracy(module: TopTail, data: Mapping[str, torch.Tensor], batch: int = 256) -> float:
    correct = 0
    for part in chunks(data, batch):
        correct += int((module(part).argmax(-1) == part["labels"]).sum())
    return correct / data["labels"].size(0)


@torch.no_grad()
def check_tail(model: nn.Module, tail: TopTail, ids: torch.Tensor, mask: torch.Tensor, features: Mapping[str, torch.Tensor]) -> float:
    """max |full-model logits - tail logits| / max |logits|, the full model carrying the tail's LoRA as a hook."""
    last = model.config.num_hidden_layers - 1
    dense = model.encoder.layer[last].output.dense

    def add_lora(_m, args, out):
        return out + tail.lora(args[0])

    handle = dense.register_forward_hook(add_lora)
    try:
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    finally:
        handle.remove()
    full = tail.head(mean_pool(hidden, mask))
    part = tail({k: v for k, v in features.items()})
    return float((full - part).abs().max() / full.abs().max())
