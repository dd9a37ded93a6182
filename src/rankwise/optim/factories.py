"""Optimizer factories for the training loop (`core.training.optimizer.OptimizerFactory`): LoRA-Pre and GaLore.

Low-rank optimizers factor the 2-D weights of nn.Linear layers (not output heads); with an adapter method those
linears are frozen, so they apply to full fine-tuning (`rankwise finetune --method full`). The registry records name
these factories, so `rankwise finetune --optimizer NAME --optimizer-rank R` offers them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rankwise.core.training.optimizer import OptimizerFactory, factory_label
from rankwise.errors import InvalidInputError


def lora_pre(rank: int, **options: Any) -> OptimizerFactory:
    """LoRAPre with rank-`rank` moment factors for the trainable nn.Linear weights, dense AdamW for the rest.

    `options` go to LoRAPre (e.g. use_updated_factors=True, nonfinite='skip'); its seed is the run's seed.
    """
    from rankwise.optim.lora_pre import LoRAPre
    from rankwise.optim.param_groups import default_low_rank_filter, low_rank_param_groups, split_low_rank_params

    def make(module: nn.Module, config) -> torch.optim.Optimizer:
        trainable_filter = lambda name, mod, p: p.requires_grad and default_low_rank_filter(name, mod, p)  # noqa: E731
        if not split_low_rank_params(module, trainable_filter)[0]:
            raise InvalidInputError(
                "LoRA-Pre keeps low-rank states for trainable nn.Linear weight matrices and this module has none "
                "(an adapter's factors are not nn.Linear layers): use full fine-tuning (--method full) or AdamW"
            )
        groups = low_rank_param_groups(module, rank, low_rank_filter=trainable_filter)
        return LoRAPre(groups, lr=config.lr, weight_decay=config.weight_decay, seed=config.seed, **options)

    make.label = factory_label("lora-pre", rank, options)  # type: ignore[attr-defined]
    return make


def galore(rank: int, **options: Any) -> OptimizerFactory:
    """galore-torch's GaLoreAdamW at rank `rank` on the same matrices LoRA-Pre would factor.

    Its state holds a projector object, so checkpoints (checkpoint_every > 0) cannot be written with it.
    """
    from rankwise.optim.galore import galore_adamw

    def make(module: nn.Module, config) -> torch.optim.Optimizer:
        return galore_adamw(module, config.lr, rank, weight_decay=config.weight_decay, **options)

    make.label = factory_label("galore", rank, options)  # type: ignore[attr-defined]
    return make
