"""PCGrad (Yu et al. 2020, "Gradient Surgery for Multi-Task Learning"; card multitask-lora-trigger.md, (b)):
for each task n, visit the other tasks m in a random order and, where g_n' . g_m < 0, remove from g_n' its component
along the *original* g_m: g_n' <- g_n' - (g_n' . g_m / ||g_m||^2) g_m. The update is sum_n g_n'.

The visiting order is `torch.randperm(N)` per task with the task itself skipped, drawn from `generator` (the global
RNG when None). That is the order torchjd's `PCGrad` draws, so with the same global seed both give the same update
(tests/recipes/test_multitask.py checks it); a seeded `generator` makes a training run's draws independent of
everything else that uses the global RNG.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.errors import InvalidInputError, NumericalError


def _check(grads: torch.Tensor) -> None:
    if grads.dim() != 2 or grads.shape[0] < 1:
        raise InvalidInputError(f"task gradients must be a matrix [N tasks, P parameters] with N >= 1, got "
                                f"shape {tuple(grads.shape)}")
    if not torch.isfinite(grads).all():
        raise NumericalError("a task gradient holds NaN or Inf; lower the learning rate or check the losses")


def pcgrad_project(grads: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Projected task gradients [N, P] from the original ones `grads` [N, P] (unchanged). A pair that does not
    conflict is left alone, so non-conflicting gradients come back exactly; a zero g_m is skipped (nothing to
    project on)."""
    _check(grads)
    n = grads.shape[0]
    sq_norms = (grads * grads).sum(1)
    out = grads.clone()
    for i in range(n):
        order = torch.randperm(n, generator=generator)
        for j in order.tolist():
            if j == i or sq_norms[j] == 0:
                continue
            dot = out[i] @ grads[j]
            if dot < 0:
                out[i] = out[i] - (dot / sq_norms[j]) * grads[j]
    return out


def pcgrad(grads: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """The PCGrad update [P]: the sum of the projected task gradients."""
    return pcgrad_project(grads, generator).sum(0)


@dataclass(frozen=True)
class ConflictStats:
    """Pairwise gradient conflict at one step: pairs with g_n . g_m < 0 out of N (N - 1) / 2, and the least cosine."""

    conflicting_pairs: int
    pairs: int
    min_cosine: float

    @property
    def any_conflict(self) -> bool:
        return self.conflicting_pairs > 0


def conflict_stats(grads: torch.Tensor) -> ConflictStats:
    """Conflict among the task gradients [N, P] (rows)."""
    _check(grads)
    g = grads.double()
    gram = g @ g.T
    norms = gram.diagonal().clamp_min(1e-300).sqrt()
    cos = gram / (norms[:, None] * norms[None, :])
    iu = torch.triu_indices(len(g), len(g), offset=1)
    pair_dots, pair_cos = gram[iu[0], iu[1]], cos[iu[0], iu[1]]
    return ConflictStats(int((pair_dots < 0).sum()), int(pair_dots.numel()),
                         float(pair_cos.min()) if pair_cos.numel() else 1.0)


__all__ = ["ConflictStats", "conflict_stats", "pcgrad", "pcgrad_project"]
