"""One multi-task step on a shared LoRA adapter: per-task gradients of the shared (LoRA) parameters, an optional
forward-side weighting (uncertainty weighting) and a backward-side aggregator (sum, our PCGrad, or one of torchjd's
MGDA / CAGrad / UPGrad / PCGrad), written into `.grad` for the usual optimizer step.

    balancer = MultiTaskBalancer(lora_parameters(model), num_tasks=3, config=MultiTaskConfig(aggregator="pcgrad"),
                                 task_parameters=heads.parameters(), seed=0)
    opt = torch.optim.AdamW([{"params": shared + heads}, *balancer.param_groups(lr)], ...)
    info = balancer.backward([loss_1, loss_2, loss_3]); opt.step()

Why per-task gradients for every aggregator, "sum" included: the fraction of steps with a conflicting pair is a
metric of every arm, and the arms then cost the same N backward passes. Task-specific parameters (the heads) get the
gradient of the weighted sum (each head sees only its own loss); the weighting's rho gets the gradient of the
uncertainty-weighted total, from the losses' values (its own term does not depend on the adapter).

Do not stack (card (c)): uncertainty weighting rescales each g_n before conflict detection, so PCGrad then projects
reweighted gradients; the paper reports the combination far below either alone. Combining them warns
(`StackingWarning`) and still runs, so that the ablation can be measured.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from rankwise.core.options import option
from rankwise.errors import InvalidInputError
from rankwise.recipes.multitask.pcgrad import ConflictStats, conflict_stats, pcgrad
from rankwise.recipes.multitask.uncertainty import UncertaintyWeighting, stack_losses

WEIGHTINGS = ("sum", "uncertainty")
AGGREGATORS = ("sum", "pcgrad", "torchjd-pcgrad", "mgda", "cagrad", "upgrad")
TORCHJD = {"torchjd-pcgrad": "PCGrad", "mgda": "MGDA", "cagrad": "CAGrad", "upgrad": "UPGrad"}


class StackingWarning(UserWarning):
    """Uncertainty weighting combined with a gradient-conflict aggregator (the card's "do not stack")."""


@dataclass(frozen=True)
class MultiTaskConfig:
    """weighting: "sum" (every loss weight 1) or "uncertainty" (card (a)); aggregator: how the per-task gradients of
    the shared parameters become one update; cagrad_c: CAGrad's c (torchjd's default is 0.5)."""

    weighting: str = field(default="sum", metadata=option(choices=WEIGHTINGS))
    aggregator: str = field(default="sum", metadata=option(choices=AGGREGATORS))
    cagrad_c: float = 0.5

    def validate(self) -> None:
        if self.weighting not in WEIGHTINGS:
            raise InvalidInputError(f"weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if self.aggregator not in AGGREGATORS:
            raise InvalidInputError(f"aggregator must be one of {AGGREGATORS}, got {self.aggregator!r}")
        if not self.cagrad_c >= 0:
            raise InvalidInputError(f"cagrad_c must be >= 0, got {self.cagrad_c}")

    @property
    def stacked(self) -> bool:
        return self.weighting == "uncertainty" and self.aggregator != "sum"


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The trainable LoRA factors of a PEFT (or PEFT-style) model, in module order; refuses a model without any."""
    params = [p for n, p in model.named_parameters() if p.requires_grad and ("lora_A" in n or "lora_B" in n)]
    if not params:
        raise InvalidInputError("the model has no trainable LoRA parameters (no 'lora_A' / 'lora_B' weights): wrap it "
                                "with peft.get_peft_model(model, LoraConfig(...)) first")
    return params


def torchjd_aggregator(name: str, cagrad_c: float = 0.5):
    """torchjd's aggregator of that name (a callable matrix [N, P] -> [P]), as the baseline arms use it."""
    try:
        from torchjd import aggregation
    except ImportError as e:  # pragma: no cover - torchjd is a pinned dependency
        from rankwise.errors import MissingPackageError

        raise MissingPackageError("torchjd is needed for the MGDA / CAGrad / UPGrad arms: pip install torchjd") from e
    cls = getattr(aggregation, TORCHJD[name])
    return cls(c=cagrad_c) if name == "cagrad" else cls()


@dataclass(frozen=True)
class StepInfo:
    """What one step saw: the raw task losses [N], the weights applied [N], and the conflict of the (weighted)
    task gradients of the shared parameters."""

    losses: tuple[float, ...]
    weights: tuple[float, ...]
    conflict: ConflictStats


class MultiTaskBalancer(nn.Module):
    """Turns N task losses into `.grad` on the shared parameters (aggregated), the task parameters and rho."""

    def __init__(self, shared: Iterable[nn.Parameter], num_tasks: int, config: MultiTaskConfig | None = None,
                 task_parameters: Iterable[nn.Parameter] = (), seed: int = 0) -> None:
        super().__init__()
        config = config or MultiTaskConfig()
        config.validate()
        shared = list(shared)
        if num_tasks < 1:
            raise InvalidInputError(f"multi-task training needs at least one task, got num_tasks={num_tasks}")
        if not shared:
            raise InvalidInputError("no shared parameters were given (pass lora_parameters(model))")
        if config.stacked:
            warnings.warn(f"uncertainty weighting combined with the {config.aggregator!r} aggregator: reweighting "
                          "changes the gradients before conflict detection, and the paper reports the combination far "
                          "below either alone (card: do not stack); use one of them", StackingWarning, stacklevel=2)
        self.config, self.num_tasks = config, num_tasks
        self._shared = shared
        self._task_params = [p for p in task_parameters if p.requires_grad]
        self.weighting = UncertaintyWeighting(num_tasks) if config.weighting == "uncertainty" else None
        self.generator = torch.Generator().manual_seed(seed)
        self._aggregate = torchjd_aggregator(config.aggregator, config.cagrad_c) if config.aggregator in TORCHJD else None

    def param_groups(self, lr: float) -> list[dict]:
        """The optimizer groups of the balancer's own parameters (rho: no weight decay), empty without UW."""
        return [self.weighting.param_group(lr)] if self.weighting is not None else []

    def aggregate(self, grads: torch.Tensor) -> torch.Tensor:
        """Task gradients [N, P] of the shared parameters -> the update direction [P]."""
        if self.config.aggregator == "sum":
            return grads.sum(0)
        if self.config.aggregator == "pcgrad":
            return pcgrad(grads, self.generator)
        return self._aggregate(grads)

    def task_gradients(self, weighted: torch.Tensor) -> torch.Tensor:
        """The Jacobian [N, P] of the weighted losses [N] w.r.t. the shared parameters, one backward per task (a
        vmapped backward, `is_grads_batched`, measured slower on the CPU for MiniLM's layers)."""
        rows = []
        for n in range(self.num_tasks):
            g = torch.autograd.grad(weighted[n], self._shared, retain_graph=True, allow_unused=True)
            rows.append(torch.cat([(gi if gi is not None else torch.zeros_like(p)).reshape(-1)
                                   for gi, p in zip(g, self._shared)]))
        return torch.stack(rows)

    def backward(self, losses: Sequence[torch.Tensor]) -> StepInfo:
        vec = stack_losses(losses, self.num_tasks)
        w = self.weighting.weights() if self.weighting is not None else torch.ones(self.num_tasks)
        weighted = vec * w.to(vec.dtype)
        grads = self.task_gradients(weighted)
        update = self.aggregate(grads)
        offset = 0
        for p in self._shared:
            part = update[offset: offset + p.numel()].view_as(p).to(p.dtype)
            p.grad = part.clone() if p.grad is None else p.grad + part
            offset += p.numel()
        if self._task_params:
            torch.autograd.backward(weighted.sum(), inputs=self._task_params)
        if self.weighting is not None:
            self.weighting(vec.detach()).backward()
        return StepInfo(tuple(vec.tolist()), tuple(w.tolist()), conflict_stats(grads))


__all__ = ["AGGREGATORS", "MultiTaskBalancer", "MultiTaskConfig", "StackingWarning", "StepInfo", "WEIGHTINGS",
           "lora_parameters", "torchjd_aggregator"]
