"""Mixed precision for the loop: the forward pass and loss under `torch.autocast`, the weights and the optimizer
state in their own dtype (float32 masters), the backward outside the context (autograd follows the forward's
casts). On CPUs with bfloat16 matrix units (avx512_bf16, AMX) a bfloat16 forward is 2-3x faster than float32; on
others it still runs, emulated.

    TrainConfig(..., autocast="bfloat16")
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from rankwise.errors import InvalidInputError

AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def check_autocast(name: str | None) -> None:
    if name is not None and name not in AUTOCAST_DTYPES:
        raise InvalidInputError(f"autocast must be None (full precision) or one of {sorted(AUTOCAST_DTYPES)}, got {name!r}")


def autocast_context(name: str | None, module: nn.Module) -> contextlib.AbstractContextManager:
    """The context the loss is computed in: nothing for None, else autocast to that dtype on the module's device."""
    check_autocast(name)
    if name is None:
        return contextlib.nullcontext()
    device = next(module.parameters()).device.type
    return torch.autocast(device_type=device, dtype=AUTOCAST_DTYPES[name])
