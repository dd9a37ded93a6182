"""Input checks shared by the Lorsa layer, the SAE baseline and the fitting loop: clear errors before any work."""

from __future__ import annotations

import torch

from rankwise.errors import InvalidInputError, NumericalError


def check_sequence(x: torch.Tensor, d: int, what: str = "x") -> None:
    """x must be [batch, seq >= 1, d], floating point and finite (finiteness is not checkable on the meta device)."""
    if not isinstance(x, torch.Tensor):
        raise InvalidInputError(f"{what} must be a tensor [batch, seq, {d}], got {type(x).__name__}")
    if x.dim() != 3 or x.size(-1) != d:
        raise InvalidInputError(f"{what} must be [batch, seq, {d}], got shape {tuple(x.shape)}")
    if x.size(1) == 0 or x.size(0) == 0:
        raise InvalidInputError(f"{what} is empty (shape {tuple(x.shape)}): give at least one sequence of one token")
    if not x.is_floating_point():
        raise InvalidInputError(f"{what} must be floating point, got {x.dtype}")
    if not x.is_meta and not torch.isfinite(x).all():
        raise NumericalError(f"{what} holds NaN or Inf values; replace them before calling the layer")


def check_k(k: int, n: int, what: str = "heads") -> int:
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= n:
        raise InvalidInputError(f"k must be an integer in [1, {n}] (the number of {what}), got {k!r}")
    return k
