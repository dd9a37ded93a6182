"""MiniLM's frozen prefix, cached: LoRA sits on the top layer's FFN output projection (`encoder.layer.5.output.dense`,
1536 -> 384), so everything below it is a fixed function of the text and is computed once.

BertOutput computes LayerNorm(dense(x) + residual) with x the FFN's inner activation [T, 1536]. With the LoRA delta,
LayerNorm(W0 x + b + residual + s B A x): the frozen part z = W0 x + b + residual [T, 384] and x are cached per
example; the trained tail (`TopTail`) is the LoRA path, the LayerNorm, mean pooling over the mask and the head.
`check_tail` compares the tail with the full MiniLM + LoRA forward (the invariant the report states).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.models.minilm import mean_pool

TARGET = "encoder.layer.{last}.output.dense"


@torch.no_grad()
def cache_features(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, batch: int = 64) -> dict[str, torch.Tensor]:
    """{x [N, T, 1536], z [N, T, 384], attention_mask [N, T]} for token ids [N, T] (right-padded)."""
    last = model.config.num_hidden_layers - 1
    out_layer = model.encoder.layer[last].output
    got: dict[str, torch.Tensor] = {}

    def pre(_m, args):
        got["x"], got["residual"] = args[0], args[1]

    handle = out_layer.register_forward_pre_hook(pre)
    xs, zs = [], []
    try:
        for i in range(0, ids.size(0), batch):
            model(input_ids=ids[i : i + batch], attention_mask=mask[i : i + batch])
            x = got["x"]
            xs.append(x.clone())
            zs.append(F.linear(x, out_layer.dense.weight, out_layer.dense.bias) + got["residual"])
    finally:
        handle.remove()
    return {"x": torch.cat(xs), "z": torch.cat(zs), "attention_mask": mask.clone()}


class _Lora(nn.Module):
    def __init__(self, r: int, d_in: int, d_out: int) -> None:
        super().__init__()
        self.A = nn.Parameter(torch.empty(r, d_in))
        self.B = nn.Parameter(torch.zeros(d_out, r))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # PEFT's default LoRA init (B = 0)


class TopTail(nn.Module):
    """The trained part: LoRA on the top FFN output projection, its LayerNorm (frozen), mean pooling, a new head."""

    def __init__(self, layer_norm: nn.LayerNorm, r: int, alpha: float, d_in: int, num_labels: int) -> None:
        super().__init__()
        d = layer_norm.normalized_shape[0]
        self.norm = nn.LayerNorm(d, eps=layer_norm.eps)
        self.norm.load_state_dict(layer_norm.state_dict())
        self.norm.requires_grad_(False)
        self.lora = _Lora(r, d_in, d)
        self.scaling = alpha / r
        self.head = nn.Linear(d, num_labels)

    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        delta = F.linear(F.linear(batch["x"], self.lora.A), self.lora.B) * self.scaling
        return self.head(mean_pool(self.norm(batch["z"] + delta), batch["attention_mask"]))


def tail_logits(module: TopTail, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return module(batch)


@torch.no_grad()
def accuracy(module: TopTail, data: Mapping[str, torch.Tensor], batch: int = 256) -> float:
    n = data["labels"].size(0)
    correct = 0
    for i in range(0, n, batch):
        part = {k: v[i : i + batch] for k, v in data.items()}
        correct += int((module(part).argmax(-1) == part["labels"]).sum())
    return correct / n


@torch.no_grad()
def check_tail(model: nn.Module, tail: TopTail, ids: torch.Tensor, mask: torch.Tensor, features: Mapping[str, torch.Tensor]) -> float:
    """max |full-model logits - tail logits| / max |logits|, the full model carrying the tail's LoRA as a hook."""
    last = model.config.num_hidden_layers - 1
    dense = model.encoder.layer[last].output.dense

    def add_lora(_m, args, out):
        return out + F.linear(F.linear(args[0], tail.lora.A), tail.lora.B) * tail.scaling

    handle = dense.register_forward_hook(add_lora)
    try:
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    finally:
        handle.remove()
    full = tail.head(mean_pool(hidden, mask))
    part = tail({k: v for k, v in features.items()})
    return float((full - part).abs().max() / full.abs().max())
