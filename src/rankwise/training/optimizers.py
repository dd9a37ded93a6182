"""The optimizers, by name, from the registry records (`finetune --optimizer NAME --optimizer-rank R`).

AdamW is the loop's default (`core.training.optimizer.adamw`); low-rank-state optimizers (LoRA-Pre, and GaLore as
the peer baseline) take the rank first and factor the trainable nn.Linear weights (`rankwise.optim.factories`).
"""

from __future__ import annotations

from typing import Any

from rankwise.core.training.optimizer import OptimizerFactory
from rankwise.errors import InvalidInputError, UnknownNameError
from rankwise.registry import OptimizerEntry, resolve
from rankwise.registry.tables import optimizer_entries


def optimizer_entry(name: str) -> OptimizerEntry:
    entries = optimizer_entries()
    if name not in entries:
        raise UnknownNameError(f"unknown optimizer {name!r}; choose one of {sorted(entries)}")
    return entries[name]


def optimizer_factory(name: str, rank: int | None = None, **options: Any) -> OptimizerFactory:
    """The named optimizer's factory; `rank` is required by the low-rank ones and refused by the others."""
    entry = optimizer_entry(name)
    make = resolve(entry.factory)
    if entry.low_rank:
        if rank is None:
            raise InvalidInputError(f"optimizer {name!r} needs a rank (--optimizer-rank)")
        return make(rank, **options)
    if rank is not None or options:
        raise InvalidInputError(f"optimizer {name!r} takes no rank or options")
    return make()
