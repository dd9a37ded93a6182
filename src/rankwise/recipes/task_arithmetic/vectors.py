"""Task vectors: tau = theta_ft - theta_0 over a model's floating-point tensors (card task-arithmetic-fairness.md).

    tau = task_vector(base_state, finetuned_state)     # TaskVector: {name: delta [same shape as the weight]}
    tau.norm()                                          # ||tau||_2 over every tensor, float64

Only floating-point tensors carry a task vector: integer and bool buffers (position ids, BatchNorm's
`num_batches_tracked`) are counters or indices, not coordinates in weight space, so they are skipped (card invariant
6) and a merge copies them from the state it starts from. Deltas are stored in float64: the difference of two float32
tensors is then exact (for weights within 2^29 of each other in magnitude, i.e. any trained network), so that
theta_0 + 1 * tau gives back theta_ft bit for bit once cast to float32 (card invariant 2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from rankwise.core.evidence import finite_number
from rankwise.errors import InvalidInputError, NumericalError

StateLike = Mapping[str, torch.Tensor] | nn.Module


def as_state(state: StateLike, what: str = "state") -> dict[str, torch.Tensor]:
    """A module's `state_dict()` (detached) or a mapping of name -> tensor, as a plain dict."""
    if isinstance(state, nn.Module):
        return {k: v.detach() for k, v in state.state_dict().items()}
    if not isinstance(state, Mapping):
        raise InvalidInputError(f"{what} must be an nn.Module or a mapping name -> tensor, got {type(state).__name__}")
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise InvalidInputError(f"{what}: entries {bad[:5]} are not tensors")
    return dict(state)


def float_keys(state: Mapping[str, torch.Tensor]) -> list[str]:
    """The names of the floating-point tensors of `state`, the coordinates a task vector has."""
    return [k for k, v in state.items() if v.is_floating_point()]


@dataclass(frozen=True)
class TaskVector:
    """A weight-space direction: `deltas[name]` float64, the shape of tensor `name` of the model it applies to.

    It may cover a subset of a model's floating-point tensors (a LoRA vector covers only the adapted weights); a
    merge leaves the other tensors as they are."""

    deltas: dict[str, torch.Tensor]

    def __post_init__(self) -> None:
        if not self.deltas:
            raise InvalidInputError("a task vector needs at least one tensor")
        for k, v in self.deltas.items():
            if not isinstance(v, torch.Tensor) or v.dtype != torch.float64:
                raise InvalidInputError(f"task vector entry {k!r} must be a float64 tensor, got "
                                        f"{getattr(v, 'dtype', type(v).__name__)}")
            if not torch.isfinite(v).all():
                raise NumericalError(f"task vector entry {k!r} has NaN or Inf values")

    def keys(self) -> list[str]:
        return list(self.deltas)

    def norm(self) -> float:
        """||tau||_2 over every entry (float64)."""
        return math.sqrt(sum(float(v.pow(2).sum()) for v in self.deltas.values()))

    def tensor_norms(self) -> dict[str, float]:
        return {k: float(v.norm()) for k, v in self.deltas.items()}

    def scaled(self, coefficient: float) -> TaskVector:
        c = check_coefficient(coefficient, "coefficient")
        return TaskVector({k: c * v for k, v in self.deltas.items()})

    def __add__(self, other: TaskVector) -> TaskVector:
        if not isinstance(other, TaskVector):
            return NotImplemented
        check_same_keys(self, other)
        return TaskVector({k: v + other.deltas[k] for k, v in self.deltas.items()})


def check_coefficient(value: float, what: str) -> float:
    """A scaling coefficient as a finite float (NaN, infinity and non-numbers refused before any work)."""
    return finite_number(value, what)


def check_same_keys(a: TaskVector, b: TaskVector) -> None:
    if set(a.deltas) != set(b.deltas):
        only_a, only_b = sorted(set(a.deltas) - set(b.deltas)), sorted(set(b.deltas) - set(a.deltas))
        raise InvalidInputError(f"task vectors cover different tensors (only in the first: {only_a[:5]}, only in the "
                                f"second: {only_b[:5]}); vectors of the same base model are needed")
    for k, v in a.deltas.items():
        if v.shape != b.deltas[k].shape:
            raise InvalidInputError(f"task vectors disagree on the shape of {k!r}: {tuple(v.shape)} vs "
                                    f"{tuple(b.deltas[k].shape)}")


def check_aligned(base: Mapping[str, torch.Tensor], other: Mapping[str, torch.Tensor], what: str) -> None:
    """`other` has exactly the tensors of `base`, with the same shapes and float-ness (same architecture)."""
    if set(base) != set(other):
        missing, extra = sorted(set(base) - set(other)), sorted(set(other) - set(base))
        raise InvalidInputError(f"{what} does not match the base state dict (missing {missing[:5]}, extra {extra[:5]}); "
                                "task vectors need two states of the same architecture")
    for k, v in base.items():
        w = other[k]
        if v.shape != w.shape or v.is_floating_point() != w.is_floating_point():
            raise InvalidInputError(f"{what}: tensor {k!r} is {tuple(w.shape)} {w.dtype}, the base has "
                                    f"{tuple(v.shape)} {v.dtype}")


def task_vector(base: StateLike, finetuned: StateLike) -> TaskVector:
    """tau = theta_ft - theta_0 over the floating-point tensors of two states of one architecture (modules or
    state dicts; shapes per tensor as stored, weights [out, in]). Integer buffers are skipped."""
    b, f = as_state(base, "base"), as_state(finetuned, "finetuned")
    check_aligned(b, f, "the fine-tuned state")
    keys = float_keys(b)
    if not keys:
        raise InvalidInputError("the base state has no floating-point tensors: nothing to take a task vector of")
    for k in keys:
        if not (torch.isfinite(b[k]).all() and torch.isfinite(f[k]).all()):
            raise NumericalError(f"tensor {k!r} has NaN or Inf values in the base or the fine-tuned state")
    return TaskVector({k: f[k].double() - b[k].double() for k in keys})
