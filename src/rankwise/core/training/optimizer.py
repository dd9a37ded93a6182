"""What optimizer the loop uses: a factory `(module, config) -> torch.optim.Optimizer`, and the default one.

`train(..., optimizer=...)` takes any such factory; it must cover every trainable parameter. The loop sets each
group's learning rate from the schedule, scaled by the group's own learning rate relative to `config.lr`, so a
factory may give groups different learning rates. A factory's `label` attribute is what a checkpoint records, so a
resume with another optimizer (or other optimizer settings) is refused.

Named factories beyond AdamW (LoRA-Pre, GaLore, ...) live with their method (`rankwise.optim.factories`) and are
listed by the registry records; `rankwise.training.optimizers.optimizer_factory` picks one by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

OptimizerFactory = Callable[[nn.Module, Any], torch.optim.Optimizer]  # (module, TrainConfig) -> optimizer


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def adamw() -> OptimizerFactory:
    """torch.optim.AdamW over the trainable parameters with the config's lr and (decoupled) weight decay."""

    def make(module: nn.Module, config) -> torch.optim.Optimizer:
        return torch.optim.AdamW(trainable_parameters(module), lr=config.lr, weight_decay=config.weight_decay)

    make.label = "adamw"  # type: ignore[attr-defined]
    return make


def optimizer_label(factory: OptimizerFactory) -> str:
    """What a checkpoint records about the optimizer, so a resume with another optimizer is refused."""
    return getattr(factory, "label", getattr(factory, "__qualname__", type(factory).__name__))


def factory_label(name: str, rank: int, options: dict[str, Any]) -> str:
    """e.g. 'lora-pre(rank=8, nonfinite='skip')': the label of a named low-rank factory with its settings."""
    return f"{name}(rank={rank}{''.join(f', {k}={v!r}' for k, v in sorted(options.items()))})"
