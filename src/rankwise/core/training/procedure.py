"""Training procedures: what a method changes about *how* a model is trained, as hooks on the one training loop.

An adapter type (`rankwise.adapters`) says what is trained; a procedure says how: LMAO adds a zeroth-order step on
the base weights after every optimizer step, CAR-LoRA and CoA-LoRA swap the frozen base's compressed form before
each micro-batch, PESO adds a proximal term to the loss. `train(..., procedure=p)` calls the hooks; a procedure that
needs no hook leaves it as the no-op of `Procedure`. A procedure that cannot be expressed as hooks of one loop (a
federated job) names another runner (`runs_on`), which the harness runs instead of `train` (`rankwise.training.procedures`).

Order inside one optimizer step of `train`:

    for micro in range(grad_accum):
        procedure.before_micro_batch(step, micro)     # e.g. choose this micro-batch's compression operator
        loss = task.loss(model, batch) + procedure.extra_loss(module)   # extra_loss None: nothing added
        loss.backward()
    clip, optimizer.step(), zero_grad
    procedure.after_step(step, module, task, batch)   # e.g. LMAO's two-forward ZO step on the same (last) batch
    procedure.end_of_training(module)                 # once, before the final evaluation (restore a base, ...)

Determinism and resume: hooks must draw their randomness from (`seed`, `step`, `micro`) — not from a hidden
generator — so that a resumed run repeats the uninterrupted one. A procedure holding state that a checkpoint
cannot rebuild sets `resumable = False`; `train` then refuses `checkpoint_every` with it, up front.

What a procedure trains (its registry entry's `trains`): "adapter" (it needs an adapter method: `finetune --method lora --procedure
NAME`), "base" (it trains the model's own weights: `finetune --method full --procedure NAME`, e.g. WASI, TraDy) or
"both" (either). A procedure lives in its method's package beside the maths, with a builder
`(module, task, seed, config) -> Procedure` whose `config` is a frozen dataclass (`core.options`); the method's
registry record names both, which is how `rankwise finetune --procedure NAME --procedure-option KEY=VALUE` finds
them (`rankwise.training.procedures`). The builder's return annotation names the Procedure subclass, so that its
`runs_on` and `resumable` are known before any model is loaded (`training.procedures.procedure_class`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch import nn

RUNNERS = ("loop", "federated")  # what runs a procedure: the loop's hooks, or an engine of the harness

class Procedure:
    """No-op hooks; a method overrides those it needs. `name` labels the run (recorded in checkpoints)."""

    name: ClassVar[str] = "plain"
    resumable: ClassVar[bool] = True
    # "loop": the hooks below, called by `train`; "federated": a federated job that `rankwise.training.federated`
    # runs whole (`train` refuses such a procedure).
    runs_on: ClassVar[str] = "loop"
    # True: the frozen base is not the model the run started from (LMAO trains it, CoA-LoRA quantizes it): the CLI
    # writes it as DIR/model (`adapters.model.base_model_copy`) and points the adapter at it.
    changes_base: ClassVar[bool] = False

    def before_micro_batch(self, step: int, micro: int) -> None:
        """Called before the forward of micro-batch `micro` of optimizer step `step` (0-based)."""

    def extra_loss(self, module: nn.Module) -> torch.Tensor | None:
        """A term added to the task loss of every micro-batch (a scalar with a graph), or None."""
        return None

    def after_step(self, step: int, module: nn.Module, task: Any, batch: Mapping[str, torch.Tensor]) -> None:
        """Called after optimizer step `step` with the last micro-batch of that step."""

    def end_of_training(self, module: nn.Module) -> None:
        """Called once after the last step, before the final evaluation."""

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors a checkpoint must hold for an exact resume beyond the trainable parameters (e.g. LMAO's base
        weights, which its zeroth-order phase changes); saved under `procedure/<key>`."""
        return {}

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """On resume: restore what `state_tensors` returned when the checkpoint was written."""

    def describe(self) -> dict[str, Any]:
        """JSON fields recorded in the run configuration (a resume with other values is refused)."""
        return {"procedure": self.name}


ProcedureBuilder = Callable[..., Procedure]  # (module, task, seed, config) -> Procedure
