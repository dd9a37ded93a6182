"""The training contracts: what a task, a run's settings and its result are. Method packages, apps and layers
build on these (a `Task` of their own, a `TrainConfig`) and hand them to the one loop, `core.training.train`.

A task is any object with these members; `rankwise.training.tasks` has the text ones (topic classification,
language modelling) and a method's own package may define others (full-graph, image, rollout tasks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

from rankwise.core.training.precision import check_autocast
from rankwise.core.training.schedule import DECAYS
from rankwise.errors import InvalidInputError


class Task(Protocol):
    name: str
    metric: str
    higher_is_better: bool

    @property
    def num_train(self) -> int: ...
    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]: ...
    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor: ...
    def evaluate(self, module: nn.Module) -> dict[str, float]: ...
    # Optional: `batch_tokens(batch) -> int`, the tokens a batch holds (default: see `count_tokens`).


@dataclass
class TrainConfig:
    steps: int = 100  # optimizer steps
    batch_size: int = 16  # examples per micro-batch (the global batch: under DDP each rank takes an equal slice)
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_ratio: float = 0.1  # fraction of steps with linear warmup
    min_lr_ratio: float = 0.0  # the decay's floor, as a fraction of lr
    decay: str = "cosine"  # after warmup: "cosine", "linear" (to the floor) or "constant" (schedule.DECAYS)
    max_grad_norm: float | None = 1.0  # None: no clipping
    eval_every: int = 0  # 0: evaluate only at the end
    checkpoint_every: int = 0  # 0: no checkpoints
    seed: int = 0
    autocast: str | None = None  # mixed precision of the forward and loss: None (off), "bfloat16" or "float16" (precision.py)

    def validate(self) -> None:
        for name in ("steps", "batch_size", "grad_accum"):
            if getattr(self, name) < 1:
                raise InvalidInputError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise InvalidInputError(f"lr must be a positive number, got {self.lr}")
        if self.decay not in DECAYS:
            raise InvalidInputError(f"decay must be one of {list(DECAYS)}, got {self.decay!r}")
        if self.eval_every < 0 or self.checkpoint_every < 0:
            raise InvalidInputError("eval_every and checkpoint_every must be >= 0 (0 disables them)")
        check_autocast(self.autocast)

    @property
    def warmup_steps(self) -> int:
        return int(round(self.warmup_ratio * self.steps))


@dataclass
class TrainResult:
    steps: int  # steps done when this call returned (config.steps unless stopped early)
    final: dict[str, float]  # evaluation after the last step (empty when stopped early)
    history: list[dict[str, float]] = field(default_factory=list)  # per step: step, loss, lr, grad_norm, tokens (cumulative)
    evals: list[dict[str, float]] = field(default_factory=list)  # periodic evaluations with their step
    wall_s: float = 0.0
    resumed_from: int | None = None
    optimizer: torch.optim.Optimizer | None = None  # the optimizer used, with its final state (not in summary())
    world_size: int = 1  # processes that trained (DDP ranks)

    @property
    def losses(self) -> list[float]:
        return [h["loss"] for h in self.history]

    @property
    def tokens_seen(self) -> int:
        """Training tokens consumed over all ranks (see `count_tokens`)."""
        return int(self.history[-1].get("tokens", 0)) if self.history else 0

    def eval_curve(self, metric: str = "eval_loss") -> list[tuple[int, float]]:
        """(step, metric) of every evaluation, periodic and final."""
        return [(int(e["step"]), e[metric]) for e in self.evals if metric in e]


def count_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens in a batch: the attention mask's ones if there is one, else every input id, else the examples."""
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    if "input_ids" in batch:
        return batch["input_ids"].numel()
    first = next(iter(batch.values()), None)
    return int(first.size(0)) if torch.is_tensor(first) and first.dim() else 0
