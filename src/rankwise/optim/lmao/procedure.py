"""LMAO as a training procedure: the loop's normal step is the LoRA phase (1 forward + 1 backward, the optimizer step),
and `after_step` is the zeroth-order phase on the frozen base weights W (2 forwards, no backward), on the same
(last micro-) batch, at the factors the optimizer has just updated, in eval mode (no dropout) under inference mode.

    rankwise finetune --model minilm-l6 --task wiki-topics --method lora --rank 8 --procedure lmao \\
        --procedure-option base_lr=1e-6 --procedure-option eps=1e-3 --out runs/lmao

    procedure = build_procedure("lmao", module, task, seed, base_lr=1e-6)   # rankwise.training.procedures
    procedure = lmao_procedure(module, task, seed, LmaoConfig(base_lr=1e-6))   # the same, from this module
    train(module, task, config, procedure=procedure)

The ZO noise of step t is a pure function of (seed, t) (`zeroth_order.step_seed`). W changes, so a checkpoint holds
W too (`state_tensors`), and a resumed run repeats the uninterrupted one bit for bit. Because the base weights
change, `rankwise finetune` also writes the updated base model (`changes_base`; `adapters.model.base_model_copy`).
With gradient accumulation the ZO phase uses the last micro-batch of the step (the reference code refuses
accumulation).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from rankwise.core.layer_names import layer_index
from rankwise.errors import InvalidInputError
from rankwise.optim.lmao import LmaoConfig, select_base_tensors
from rankwise.optim.zeroth_order import SPSA, ZOStep, step_seed
from rankwise.core.options import config_or_options
from rankwise.core.training import Procedure


class LmaoProcedure(Procedure):
    """The ZO phase of LMAO after every optimizer step; `last` is the latest step's (L+, L-, g)."""

    name = "lmao"
    resumable = True  # W is saved in the checkpoint (state_tensors) and the noise is a function of (seed, step)
    changes_base = True  # finetune writes the updated base model beside the adapter

    def __init__(self, module: nn.Module, config: LmaoConfig, seed: int) -> None:
        config.validate()
        self.config, self.seed = config, int(seed)
        keep = None
        if config.top_k_layers is not None:
            keep = _top_layers_filter(module, config.top_k_layers)
        self.tensors = select_base_tensors(module, config.params, keep)
        self.spsa = SPSA(module, self.tensors, config.eps, config.perturbation)
        self.last: ZOStep | None = None
        self.steps_done = 0

    def after_step(self, step: int, module: nn.Module, task: Any, batch: Mapping[str, torch.Tensor]) -> None:
        was_training = module.training
        module.eval()  # dropout off for both ZO forwards (the reference code's choice)
        try:
            with torch.inference_mode():
                plus, minus, g = self.spsa.projected_gradient(lambda: task.loss(module, batch), step_seed(self.seed, step))
        finally:
            module.train(was_training)
        self.last = self.spsa.step_from(plus, minus, g, step_seed(self.seed, step), self.config.base_lr,
                                        self.config.weight_decay)
        self.steps_done += 1

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {f"base/{n}": p.detach() for n, p in self.tensors}

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        want = {f"base/{n}" for n, _ in self.tensors}
        if set(tensors) != want:
            raise InvalidInputError(f"the checkpoint's LMAO base weights ({len(tensors)} tensors) do not match this run's "
                                    f"selection ({len(want)}): it was written by another LMAO configuration")
        with torch.no_grad():
            for n, p in self.tensors:
                p.copy_(tensors[f"base/{n}"])

    def describe(self) -> dict[str, Any]:
        return {"procedure": self.name, **{f"lmao {k}": v for k, v in self.config.to_dict().items()},
                "lmao zo_tensors": len(self.tensors), "lmao zo_parameters": self.spsa.numel}


def _top_layers_filter(module: nn.Module, k: int):
    indices = {i for n, _ in module.named_parameters() if (i := layer_index(n)) is not None}
    if not indices:
        raise InvalidInputError("LMAO top_k_layers needs a layer stack (names like encoder.layer.3 or model.layers.3)")
    if k > len(indices):
        raise InvalidInputError(f"LMAO top_k_layers={k} exceeds the {len(indices)} layers of this model")
    top = set(sorted(indices)[-k:])
    return lambda name: layer_index(name) in top


def lmao_procedure(module: nn.Module, task: Any, seed: int, config: LmaoConfig | None = None, **options: Any) -> LmaoProcedure:
    """The builder `rankwise finetune --procedure lmao --procedure-option KEY=VALUE` calls (options: LmaoConfig's
    fields, parsed by `core.options`)."""
    return LmaoProcedure(module, config_or_options(LmaoConfig, config, options, "procedure lmao"), seed)
