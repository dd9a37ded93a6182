"""Input checks shared by the LRNN modules: a clear `RankwiseError` before any work."""

from __future__ import annotations

import torch

from rankwise.errors import InvalidInputError, NumericalError


def check_features(x: object, in_features: int, who: str) -> torch.Tensor:
    """x must be a floating tensor [..., in_features] with at least one row and finite entries."""
    if not isinstance(x, torch.Tensor):
        raise InvalidInputError(f"{who}: input must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise InvalidInputError(f"{who}: input must be a floating tensor, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != in_features:
        raise InvalidInputError(f"{who}: input must have shape [..., {in_features}], got {tuple(x.shape)}")
    if x.numel() == 0:
        raise InvalidInputError(f"{who}: input is empty (shape {tuple(x.shape)}); pass at least one point")
    # The meta device carries shapes only; there is nothing to check for finiteness.
    if x.device.type != "meta" and not bool(torch.isfinite(x).all()):
        raise NumericalError(f"{who}: input has NaN or Inf entries")
    return x


def check_positive(**values: int) -> None:
    """Every named size must be an int >= 1."""
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InvalidInputError(f"{name} must be an int >= 1, got {v!r}")
