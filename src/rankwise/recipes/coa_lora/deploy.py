"""Deploying one configuration: the quantized base it runs on and the PEFT folder of its adjusted LoRA.

For configuration C a CoA-LoRA layer is the plain LoRA delta s * (B (I + U_C)) A on the base Q_C(W): saving the
adapter while C is applied writes exactly that delta as PEFT's lora_A / lora_B (with C itself recorded in the
rankwise state as each layer's `knobs`), so `peft.PeftModel.from_pretrained` on a base model whose targeted weights
are Q_C(W) (`quantized_base_weights`) computes what rankwise computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.recipes.coa_lora.bank import QuantizedBank
from rankwise.recipes.coa_lora.space import Configuration


def quantized_base_weights(bank: QuantizedBank, config: Sequence, prefix: str = "") -> dict[str, torch.Tensor]:
    """`<module name without prefix>.weight` -> Q_C(W) [out, in] for every quantized layer (load into a plain base
    model with `load_state_dict(..., strict=False)` or `set_quantized_base`)."""
    config = bank.space.check(config)
    out = {}
    for name, option in zip(bank.space.layers, config):
        if not name.startswith(prefix):
            raise InvalidInputError(f"layer {name!r} does not start with prefix {prefix!r}")
        out[f"{name[len(prefix):]}.weight"] = bank.weight(name, option)
    return out


@torch.no_grad()
def set_quantized_base(model: nn.Module, weights: dict[str, torch.Tensor]) -> nn.Module:
    """Copy `quantized_base_weights` into a plain (unadapted) model in place; returns it."""
    params = dict(model.named_parameters())
    missing = [k for k in weights if k not in params]
    if missing:
        raise InvalidInputError(f"the model has no parameter(s) {missing[:3]}: was the prefix right?")
    for k, w in weights.items():
        params[k].copy_(w)
    return model


def export_configuration(adapted: Any, bank: QuantizedBank, config: Sequence, folder: str | Path, **save_kwargs: Any) -> Configuration:
    """Apply `config` (base and adapters) and save `adapted` (an AdaptedModel) to `folder` as a PEFT folder of that
    configuration's adjusted LoRA. The configuration stays applied; returns it."""
    applied = bank.apply(config)
    adapted.save(folder, **save_kwargs)
    return applied
