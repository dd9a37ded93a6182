"""Uncertainty weighting with the JailbreakLoRA regulariser (card multitask-lora-trigger.md, (a)):

    total(L, rho) = sum_n [ L_n / (2 sigma_n^2) + log(1 + sigma_n^2) ],   sigma_n^2 = softplus(rho_n)

The regulariser is log(1 + sigma^2), not Kendall et al.'s log sigma: it still stops sigma^2 from growing without
bound, but it stays finite as sigma -> 0. For a fixed L_n the rho-gradient vanishes where sigma^4 / (1 + sigma^2) =
L_n / 2 (the card's stationarity; `stationary_variance` solves it). rho starts at softplus^-1(1) = log(e - 1), so
sigma^2 = 1 and total = sum L_n / 2 + N log 2 at the start.

The rho parameters must train with the adapter's optimizer but with no weight decay and outside gradient clipping
(the card's pitfall: otherwise they stall): `param_group()` gives them their own group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.errors import InvalidInputError

SIGMA2_INIT = 1.0
RHO_INIT = math.log(math.expm1(SIGMA2_INIT))  # softplus(RHO_INIT) = 1


def stack_losses(losses: Sequence[torch.Tensor] | torch.Tensor, expected: int | None = None) -> torch.Tensor:
    """The task losses as one vector [N] (each a scalar tensor); refuses an empty or mis-sized list before any work."""
    if isinstance(losses, torch.Tensor):
        losses = list(losses.reshape(-1)) if losses.dim() <= 1 else None  # type: ignore[assignment]
        if losses is None:
            raise InvalidInputError("task losses must be a vector [N] or a list of scalar tensors")
    if len(losses) == 0:
        raise InvalidInputError("no task losses were given: multi-task balancing needs at least one task")
    if expected is not None and len(losses) != expected:
        raise InvalidInputError(f"got {len(losses)} task losses for {expected} tasks; pass one loss per task, in order")
    for i, loss in enumerate(losses):
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise InvalidInputError(f"task loss {i} must be a scalar tensor, got {type(loss).__name__}"
                                    f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}")
    return torch.stack([loss.reshape(()) for loss in losses])


class UncertaintyWeighting(nn.Module):
    """Learnable per-task variances sigma_n^2 = softplus(rho_n), rho [N], initialised at sigma^2 = 1.

    `forward(losses)` returns the weighted total (a scalar); `weights()` the current 1 / (2 sigma^2) [N].
    """

    def __init__(self, num_tasks: int) -> None:
        super().__init__()
        if num_tasks < 1:
            raise InvalidInputError(f"uncertainty weighting needs at least one task, got num_tasks={num_tasks}")
        self.num_tasks = num_tasks
        self.rho = nn.Parameter(torch.full((num_tasks,), RHO_INIT))

    def variances(self) -> torch.Tensor:
        """sigma^2 [N] (differentiable in rho)."""
        return F.softplus(self.rho)

    def weights(self) -> torch.Tensor:
        """The loss weights 1 / (2 sigma^2) [N], detached (what the gradient of L_n is scaled by)."""
        return (0.5 / self.variances()).detach()

    def forward(self, losses: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        vec = stack_losses(losses, self.num_tasks)
        s2 = self.variances().to(vec.dtype)
        return (vec / (2.0 * s2) + torch.log1p(s2)).sum()

    def param_group(self, lr: float) -> dict:
        """An optimizer parameter group for rho: the given lr, no weight decay (keep it out of clipping too)."""
        return {"params": [self.rho], "lr": lr, "weight_decay": 0.0}


def stationary_variance(loss: float) -> float:
    """The sigma^2 > 0 where d/d sigma^2 [L / (2 sigma^2) + log(1 + sigma^2)] = 0, i.e. sigma^4 / (1 + sigma^2) = L/2:
    the positive root of s^2 - (L/2) s - L/2 = 0. Needs L > 0."""
    if not loss > 0:
        raise InvalidInputError(f"the stationary variance needs a positive loss, got {loss}")
    half = loss / 2.0
    return (half + math.sqrt(half * half + 4.0 * half)) / 2.0


__all__ = ["RHO_INIT", "SIGMA2_INIT", "UncertaintyWeighting", "stack_losses", "stationary_variance"]
