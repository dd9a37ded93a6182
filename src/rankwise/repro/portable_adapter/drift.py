"""A drifted base θ₀': the adapted blocks' weights continue-trained on another domain (Python docs), as a new base
version would be. θ₀ itself is never written: its weight tensors are set aside, the training runs on clones, and the
clones are θ₀'.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rankwise.training import TrainConfig, train
from rankwise.training.top_layers_lm import TopLayersLM


class _Blocks(nn.Module):
    """The blocks whose base weights drift, as the module `train` updates (the task runs the whole model)."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)


def drift_blocks(blocks: list[nn.Module], task: TopLayersLM, steps: int, batch: int, lr: float, seed: int
                 ) -> tuple[dict[str, torch.Tensor], float]:
    """Continue-train every weight of `blocks` (no adapter must be active) with AdamW on `task`; return θ₀'
    (parameter name in `_Blocks` -> tensor) and the relative drift ||θ₀' - θ₀|| / ||θ₀|| over those weights.
    The blocks are left holding θ₀ (the original tensors) and frozen."""
    holder = _Blocks(blocks)
    params = dict(holder.named_parameters())
    original = {n: p.data for n, p in params.items()}
    for p in params.values():
        p.data = p.data.clone()  # train a copy: θ₀'s tensors are never written
        p.requires_grad_(True)
    try:
        torch.manual_seed(seed)
        train(holder, task, TrainConfig(steps=steps, batch_size=batch, lr=lr, seed=seed, warmup_ratio=0.0, decay="constant"))
        drifted = {n: p.data for n, p in params.items()}
    finally:
        for n, p in params.items():
            p.data = original[n]
            p.requires_grad_(False)
    num = sum(float((drifted[n].double() - original[n].double()).pow(2).sum()) for n in params)
    den = sum(float(original[n].double().pow(2).sum()) for n in params)
    return drifted, math.sqrt(num / den)


def swap_in(blocks: list[nn.Module], tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Point the blocks' parameters at `tensors` (no copy); return the tensors they held before."""
    holder = _Blocks(blocks)
    before = {}
    for n, p in holder.named_parameters():
        before[n] = p.data
        p.data = tensors[n]
    return before
