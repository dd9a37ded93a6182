"""Subgroup task vectors: one fine-tuning of a fresh copy of theta_0 per subgroup, on that subgroup's rows only, and
tau_g = theta_g - theta_0 (the paper's `run_task_vector`).

    vectors = subgroup_task_vectors(base, groups, finetune)   # {g: TaskVector}
    merged = scale_sum(base.state_dict(), list(vectors.values()), lam)

`finetune(module, rows)` trains `module` in place on the training rows `rows` ([n_g] int64 indices); the caller owns
the data and the protocol (the paper: the same epochs, batch size and learning rate for every group, so a small group
gets few steps and a short vector). Every copy starts from the same theta_0, head included (card pitfall: vectors
from different starting points are not comparable). `groups` is [N] int codes, or an [N, G] bool membership matrix
when a row may belong to several groups (it then trains each of its groups' models).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.recipes.task_arithmetic.vectors import TaskVector, as_state, task_vector


def membership(groups: torch.Tensor, num_groups: int | None = None) -> torch.Tensor:
    """[N] int codes or [N, G] bool -> [N, G] bool membership."""
    if not isinstance(groups, torch.Tensor):
        raise InvalidInputError(f"groups must be a tensor, got {type(groups).__name__}")
    if groups.dim() == 2 and groups.dtype == torch.bool:
        if num_groups is not None and groups.size(1) != num_groups:
            raise InvalidInputError(f"membership has {groups.size(1)} columns, num_groups is {num_groups}")
        return groups
    if groups.dim() != 1 or groups.dtype.is_floating_point or groups.dtype == torch.bool:
        raise InvalidInputError(f"groups must be [N] integer codes or an [N, G] bool matrix, got "
                                f"{tuple(groups.shape)} {groups.dtype}")
    if groups.numel() and int(groups.min()) < 0:
        raise InvalidInputError("group codes must be >= 0")
    g = (int(groups.max()) + 1 if groups.numel() else 0) if num_groups is None else int(num_groups)
    if groups.numel() and int(groups.max()) >= g:
        raise InvalidInputError(f"group code {int(groups.max())} >= num_groups {g}")
    return torch.nn.functional.one_hot(groups.long(), g).bool()


def subgroup_task_vectors(base: nn.Module, groups: torch.Tensor, finetune: Callable[[nn.Module, torch.Tensor], None],
                          which: Sequence[int] | None = None, num_groups: int | None = None) -> dict[int, TaskVector]:
    """tau_g for each group g in `which` (default: every group), in that order. Groups without a training row are
    refused before any training; `base` is left unchanged."""
    m = membership(groups, num_groups)
    which = list(range(m.size(1))) if which is None else [int(g) for g in which]
    if not which:
        raise InvalidInputError("no groups to take subgroup vectors of")
    bad = [g for g in which if not 0 <= g < m.size(1)]
    if bad:
        raise InvalidInputError(f"groups {bad} are outside 0..{m.size(1) - 1}")
    empty = [g for g in which if not bool(m[:, g].any())]
    if empty:
        raise InvalidInputError(f"groups {empty} have no training row, so no subgroup model can be trained; leave "
                                "them out with `which`")
    theta0 = {k: v.clone() for k, v in as_state(base).items()}
    out: dict[int, TaskVector] = {}
    for g in which:
        model = copy.deepcopy(base)
        finetune(model, torch.nonzero(m[:, g]).flatten())
        out[g] = task_vector(theta0, model)
    return out


def worst_group(scores: torch.Tensor, exclude: Sequence[int] = ()) -> int:
    """The group with the largest score (e.g. the mean of one-vs-rest DPD and EOD under FFT), skipping `exclude`
    (the paper leaves its "others" buckets out). scores [G]."""
    if not isinstance(scores, torch.Tensor) or scores.dim() != 1 or not scores.is_floating_point():
        raise InvalidInputError("scores must be a 1-D float tensor [G]")
    if not torch.isfinite(scores).all():
        raise InvalidInputError("scores must be finite")
    keep = [g for g in range(scores.numel()) if g not in set(exclude)]
    if not keep:
        raise InvalidInputError("every group is excluded")
    return max(keep, key=lambda g: (float(scores[g]), -g))
