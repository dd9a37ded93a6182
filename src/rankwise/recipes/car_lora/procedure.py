"""CAR-LoRA as a training procedure: before every micro-batch, the frozen base of the adapted blocks is replaced by
its form under one compression operator drawn uniformly from the set, as a pure function of (seed, step, micro); the
adapter is a plain LoRA (its PEFT folder is LoRA's), trained on E_C[L(C(θ₀) + Δθ)].

    rankwise finetune --model smollm2-135m --task wiki-lm --method lora --rank 8 --top-k-layers 4 \\
        --procedure car-lora --procedure-option operators=int8,nf4,fp4,prune,skip --out runs/car

After each optimizer step (so for periodic evaluations and checkpoints) and at the end of training the base is θ₀
again: what finetune saves is a LoRA for the original model, which is never modified.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rankwise.core.options import config_or_options
from rankwise.core.training import Procedure
from rankwise.errors import InvalidInputError
from rankwise.quant.compression_ops import parse_operators
from rankwise.recipes.car_lora.compressed_base import CompressedBase

DEFAULT_OPERATORS = "int8,nf4,fp4,prune,skip"  # the paper's five

# Block indices: 28, "27,28" or (27, 28); checked against the model by the builder.
Blocks = int | str | tuple[int, ...] | None


@dataclass(frozen=True)
class CarLoraConfig:
    """The operator set (names, comma-separated or a list) and the blocks whose base is compressed (default: the
    adapted blocks) or skipped by the `skip` operator (default: their middle one)."""

    operators: str | tuple[str, ...] = DEFAULT_OPERATORS
    layers: Blocks = None
    skip_layers: Blocks = None

    def validate(self) -> None:
        parse_operators(self.operators)  # unknown or repeated operator names
        _indices(self.layers, "layers")
        _indices(self.skip_layers, "skip_layers")


def operator_index(seed: int, step: int, micro: int, n: int) -> int:
    """The operator of micro-batch `micro` of step `step`: uniform over n, a pure function of its arguments."""
    key = ((seed % 2**31) * 1_000_003 + step) * 1_009 + micro
    return int(torch.randint(n, (1,), generator=torch.Generator().manual_seed(key)))


class CarLoraProcedure(Procedure):
    """Resample the compressed base per micro-batch from `operators` (names in `base`)."""

    name = "car-lora"
    resumable = True  # no state: the operator of each micro-batch is recomputed from (seed, step, micro)

    def __init__(self, base: CompressedBase, operators: Sequence[str], seed: int) -> None:
        unknown = [o for o in operators if o not in base.names]
        if not operators or unknown:
            raise InvalidInputError(f"operators {list(operators)} must be a non-empty subset of the base's {base.names}")
        self.base, self.operators, self.seed = base, list(operators), seed
        self.counts = {o: 0 for o in self.operators}  # micro-batches per operator, for the record

    def operator_at(self, step: int, micro: int) -> str:
        return self.operators[operator_index(self.seed, step, micro, len(self.operators))]

    def before_micro_batch(self, step: int, micro: int) -> None:
        op = self.operator_at(step, micro)
        self.counts[op] += 1
        self.base.apply(op)

    def after_step(self, step: int, module: nn.Module, task: Any, batch: Any) -> None:
        self.base.restore()  # periodic evaluations and checkpoints see θ₀

    def end_of_training(self, module: nn.Module) -> None:
        self.base.restore()

    def describe(self) -> dict[str, Any]:
        return {"procedure": self.name, "operators": self.operators, "compressed_layers": self.base.layers,
                "skip_layers": self.base.skip_layers}


def car_lora_procedure(module: nn.Module, task: Any, seed: int, config: CarLoraConfig | None = None, **options: Any) -> CarLoraProcedure:
    """Builder for `rankwise finetune --procedure car-lora` (options: CarLoraConfig's fields)."""
    config = config_or_options(CarLoraConfig, config, options, "car-lora")
    ops = parse_operators(config.operators)
    base = CompressedBase(module, ops, layers=_indices(config.layers, "layers"), skip_layers=_indices(config.skip_layers, "skip_layers"))
    return CarLoraProcedure(base, [o.name for o in ops], seed)


def _indices(value: Any, what: str) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, str):
        try:
            return [int(v) for v in value.split(",") if v.strip()]
        except ValueError:
            pass
    elif isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    raise InvalidInputError(f"car-lora option {what} takes block indices such as 28 or 27,28, got {value!r}")
