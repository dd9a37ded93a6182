"""The built-in training procedures, registered under their CLI names (`rankwise finetune --procedure NAME`), and
`build_procedure`, which the CLI calls.

Each method registers one line here: `register_procedure("lmao", lmao_procedure)`, its builder living beside the
method's code. (Here rather than in `procedures`, which every procedure module imports: no import cycle.)
"""

from __future__ import annotations

from typing import Any

from torch import nn

from rankwise.errors import UnknownNameError
from rankwise.training.procedures import PROCEDURES, Procedure, register_procedure


def build_procedure(name: str, module: nn.Module, task: Any, seed: int, **options: Any) -> Procedure:
    """The procedure `name` for this module and task; options are the builder's keyword arguments."""
    if name not in PROCEDURES:
        raise UnknownNameError(f"unknown training procedure {name!r}; known: {sorted(PROCEDURES)}")
    return PROCEDURES[name](module, task, seed, **options)


from rankwise.training.lmao import lmao_procedure  # noqa: E402

register_procedure("lmao", lmao_procedure)

from rankwise.training.peso import peso_procedure  # noqa: E402

register_procedure("peso", peso_procedure)

from rankwise.training.car_lora import car_lora_procedure  # noqa: E402

register_procedure("car-lora", car_lora_procedure)

from rankwise.training.coa_lora import coa_lora_procedure  # noqa: E402

register_procedure("coa-lora", coa_lora_procedure)

from rankwise.training.la_lora_procedure import la_lora_procedure  # noqa: E402

register_procedure("la-lora", la_lora_procedure)
