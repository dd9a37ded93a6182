"""CodeQuant's activation quantizer Q_a: per-token asymmetric min-max integer quantization.

For each token (row of `x [..., d]`), or each run of `group` channels of it:

    scale = max((max - min) / (2^b - 1), 1e-5),   q = clamp(round((x - min) / scale), 0, 2^b - 1),   x_hat = q * scale + min

`round` has zero gradient, so a rotation trained through `fake_quant` learns only through the scale/min path and
through `x` itself (the paper's objective has no straight-through estimator). Idempotent: a dequantized row keeps its
min and max (both are levels), so it quantizes to the same codes.
"""

from __future__ import annotations

import torch

from rankwise.errors import InvalidInputError, NumericalError

MIN_SCALE = 1e-5


def check_bits(bits: int) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 16:
        raise InvalidInputError(f"activation bits must be an integer in [2, 16], got {bits!r}")


def _grouped(x: torch.Tensor, group: int | None) -> torch.Tensor:
    if group is None:
        return x.unsqueeze(-2)  # [..., 1, d]
    d = x.size(-1)
    if isinstance(group, bool) or not isinstance(group, int) or group < 1 or d % group:
        raise InvalidInputError(f"activation group {group!r} must be a positive divisor of the channel count {d}")
    return x.unflatten(-1, (d // group, group))  # [..., d / group, group]


def token_codes(x: torch.Tensor, bits: int = 4, group: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Integer codes of `x [..., d]`: (codes [..., G, d/G] in [0, 2^bits), scale [..., G, 1], minimum [..., G, 1]).

    G = 1 (`group=None`, the whole token) or d / group. Codes are uint8 up to 8 bits, int32 above.
    """
    check_bits(bits)
    if not torch.isfinite(x).all():
        raise NumericalError("activations contain NaN or infinity: nothing to quantize")
    g = _grouped(x, group)
    lo = g.amin(-1, keepdim=True)
    scale = ((g.amax(-1, keepdim=True) - lo) / (2**bits - 1)).clamp_min(MIN_SCALE)
    codes = torch.clamp(torch.round((g - lo) / scale), 0, 2**bits - 1)
    return codes.to(torch.uint8 if bits <= 8 else torch.int32), scale, lo


def fake_quant(x: torch.Tensor, bits: int = 4, group: int | None = None) -> torch.Tensor:
    """Q_a(x): quantize and dequantize, same shape and dtype as `x [..., d]`; differentiable through scale and min."""
    check_bits(bits)
    g = _grouped(x, group)
    lo = g.amin(-1, keepdim=True)
    scale = ((g.amax(-1, keepdim=True) - lo) / (2**bits - 1)).clamp_min(MIN_SCALE)
    q = torch.clamp(torch.round((g - lo) / scale), 0, 2**bits - 1).detach()  # round: zero gradient, as in the paper
    return (q * scale + lo).flatten(-2) if group is not None else (q * scale + lo).squeeze(-2)
