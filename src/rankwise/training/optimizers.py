"""Which optimizer the fine-tuning loop uses: a factory `(module, config) -> torch.optim.Optimizer`.

`train(..., optimizer=...)` takes any such factory. The built-in ones are named so the CLI and reproductions can pick
them: `adamw` (the default: torch AdamW over every trainable parameter), `lora-pre` (AdamW moments kept as rank-r
factors for the weight matrices, see rankwise.optim.lora_pre) and `galore` (the galore-torch package). The loop sets
each group's learning rate from the schedule, scaled by the group's own learning rate relative to `config.lr`, so a
factory may give groups different learning rates.

Low-rank optimizers factor the 2-D weights of nn.Linear layers (not output heads); with an adapter method those
linears are frozen, so they apply to full fine-tuning (`rankwise finetune --method full`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rankwise.errors import InvalidInputError, UnknownNameError

OptimizerFactory = Callable[[nn.Module, Any], torch.optim.Optimizer]  # (module, TrainConfig) -> optimizer


def _label(name: str, rank: int, options: dict[str, Any]) -> str:
    """e.g. 'lora-pre(rank=8, nonfinite='skip')': what a checkpoint records to refuse a resume with other settings."""
    return f"{name}(rank={rank}{''.join(f', {k}={v!r}' for k, v in sorted(options.items()))})"


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def adamw() -> OptimizerFactory:
    """torch.optim.AdamW over the trainable parameters with the config's lr and (decoupled) weight decay."""

    def make(module: nn.Module, config) -> torch.optim.Optimizer:
        return torch.optim.AdamW(_trainable(module), lr=config.lr, weight_decay=config.weight_decay)

    make.label = "adamw"  # type: ignore[attr-defined]
    return make


def lora_pre(rank: int, **options: Any) -> OptimizerFactory:
    """LoRAPre with rank-`rank` moment factors for the trainable nn.Linear weights, dense AdamW for the rest.

    `options` go to LoRAPre (e.g. use_updated_factors=True, nonfinite='skip'); its seed is the run's seed.
    """
    from rankwise.optim import LoRAPre
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

    make.label = _label("lora-pre", rank, options)  # type: ignore[attr-defined]
    return make


def galore(rank: int, **options: Any) -> OptimizerFactory:
    """galore-torch's GaLoreAdamW at rank `rank` on the same matrices LoRA-Pre would factor.

    Its state holds a projector object, so checkpoints (checkpoint_every > 0) cannot be written with it.
    """
    from rankwise.optim import galore_adamw

    def make(module: nn.Module, config) -> torch.optim.Optimizer:
        return galore_adamw(module, config.lr, rank, weight_decay=config.weight_decay, **options)

    make.label = _label("galore", rank, options)  # type: ignore[attr-defined]
    return make


OPTIMIZERS: dict[str, Callable[..., OptimizerFactory]] = {"adamw": adamw, "lora-pre": lora_pre, "galore": galore}
LOW_RANK = {"lora-pre", "galore"}


def optimizer_factory(name: str, rank: int | None = None, **options: Any) -> OptimizerFactory:
    """The named optimizer's factory; `rank` is required by the low-rank ones and refused by AdamW."""
    if name not in OPTIMIZERS:
        raise UnknownNameError(f"unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}")
    if name in LOW_RANK:
        if rank is None:
            raise InvalidInputError(f"optimizer {name!r} needs a rank (--optimizer-rank)")
        return OPTIMIZERS[name](rank, **options)
    if rank is not None or options:
        raise InvalidInputError(f"optimizer {name!r} takes no rank or options")
    return OPTIMIZERS[name]()


def optimizer_label(factory: OptimizerFactory) -> str:
    """What a checkpoint records about the optimizer, so a resume with another optimizer is refused."""
    return getattr(factory, "label", getattr(factory, "__qualname__", type(factory).__name__))
