"""Input checks shared by the token mixers: clear errors before any work."""

from __future__ import annotations

import torch

from rankwise.errors import InvalidInputError, NumericalError

MODES = ("chunked", "recurrent")


def positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{what} must be a positive int, got {value!r}")
    return value


def check_sequence(x: object, d_model: int, layer: str) -> torch.Tensor:
    """x must be a finite floating tensor [batch, seq, d_model] with batch, seq >= 1."""
    if not isinstance(x, torch.Tensor):
        raise InvalidInputError(f"{layer}: input must be a torch.Tensor [batch, seq, {d_model}], got {type(x).__name__}")
    if x.ndim != 3 or x.shape[-1] != d_model:
        raise InvalidInputError(f"{layer}: input must be [batch, seq, d_model={d_model}], got shape {tuple(x.shape)}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise InvalidInputError(f"{layer}: empty input (shape {tuple(x.shape)}): give at least one sequence of at "
                                "least one token")
    if not x.is_floating_point():
        raise InvalidInputError(f"{layer}: input must be floating point, got {x.dtype}")
    # The meta device has no values to check (shape propagation only).
    if x.device.type != "meta" and not bool(torch.isfinite(x).all()):
        raise NumericalError(f"{layer}: input has NaN or Inf values; the recurrence would spread them to every "
                             "later token")
    return x


def check_mode(mode: object, layer: str) -> str:
    if mode not in MODES:
        raise InvalidInputError(f"{layer}: mode must be one of {MODES}, got {mode!r}")
    return str(mode)


__all__ = ["MODES", "check_mode", "check_sequence", "positive_int"]
