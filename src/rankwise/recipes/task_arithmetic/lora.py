"""The task vector of a LoRA adapter: tau[W] = scaling * B A for every adapted linear, keyed like the base model's
state dict (card pitfall: merge B A, never A and B separately).

    peft_model = peft.get_peft_model(base, LoraConfig(r=4, target_modules=["fc1", "fc2", "head"]))
    ...train...
    tau = lora_task_vector(peft_model)              # {"fc1.weight": [out, in], ...}, float64
    merged = add_vectors(base_state, [tau], [1.0])  # = peft_model.merge_and_unload().state_dict()

The peft model is read, never modified. Only plain LoRA on `nn.Linear` is read; DoRA, fan-in-fan-out weights and
`modules_to_save` (a fully trained copy of a module, which is not a low-rank delta) are refused rather than dropped.
"""

from __future__ import annotations

import torch
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.recipes.task_arithmetic.vectors import TaskVector


def lora_task_vector(peft_model: nn.Module, adapter: str = "default") -> TaskVector:
    """scaling * lora_B.weight [out, r] @ lora_A.weight [r, in] for each LoRA linear of `peft_model` (a
    `peft.PeftModel`), as a task vector over the base model's `<module>.weight` names."""
    from peft.tuners.lora import LoraLayer  # lazy: peft imports transformers

    if not hasattr(peft_model, "get_base_model"):
        raise InvalidInputError(f"expected a peft.PeftModel, got {type(peft_model).__name__}")
    base = peft_model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if type(module).__name__ == "ModulesToSaveWrapper":
            raise InvalidInputError(f"module {name!r} is a modules_to_save copy, which is not a low-rank delta; "
                                    "take its task vector with task_vector() on the merged model instead")
        if not isinstance(module, LoraLayer) or adapter not in module.lora_A:
            continue
        if not isinstance(module.get_base_layer(), nn.Linear):
            raise InvalidInputError(f"LoRA module {name!r} wraps a {type(module.get_base_layer()).__name__}; only "
                                    "nn.Linear is read")
        if getattr(module, "fan_in_fan_out", False) or module.use_dora.get(adapter, False):
            raise InvalidInputError(f"LoRA module {name!r} uses fan_in_fan_out or DoRA, which this reader refuses")
        a, b = module.lora_A[adapter].weight, module.lora_B[adapter].weight
        # The product in float64: the vector is summed and scaled later, and float64 keeps that arithmetic exact.
        deltas[f"{name}.weight"] = float(module.scaling[adapter]) * (b.detach().double() @ a.detach().double())
    if not deltas:
        raise InvalidInputError(f"no LoRA layer with adapter {adapter!r} in the model")
    return TaskVector(deltas)
