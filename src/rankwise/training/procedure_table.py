"""The built-in training procedures, registered under their CLI names (`rankwise finetune --procedure NAME`).

Each method registers one line here: `register_procedure("lmao", lmao_procedure)`, its builder living beside the
method's code. Imported lazily by `procedures.build_procedure`.
"""

from __future__ import annotations

from rankwise.training.procedures import register_procedure  # noqa: F401  (used by the lines below)

from rankwise.training.peso import peso_procedure  # noqa: E402

register_procedure("peso", peso_procedure)
