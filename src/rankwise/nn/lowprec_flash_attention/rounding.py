"""The rounding points of an emulated bf16 kernel, each a pure function of an fp32 tensor.

A GPU flash-attention kernel multiplies bf16 operands, accumulates in fp32 and rounds results back to bf16. CPU bf16
matmuls accumulate differently, so the kernel here computes in fp32 and calls these functions exactly where the GPU
kernel would round: the bias the paper finds lives in those roundings, not in the arithmetic between them.
"""

from __future__ import annotations

import torch

from rankwise.errors import InvalidInputError

_LOW = 0xFFFF  # the 16 mantissa bits fp32 has and bf16 drops


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest bf16 value, ties to even (IEEE's default, what `.to(torch.bfloat16)` does), returned
    in fp32. Written on the bits: fp32 -> add 0x7FFF + (the kept LSB) -> clear the low 16 bits. NaN stays NaN; a
    finite value past bf16's largest rounds to inf, as the cast does. x: any shape, float32."""
    if x.dtype != torch.float32:
        raise InvalidInputError(f"bf16_round takes float32 (the kernel's accumulator), got {x.dtype}")
    bits = x.view(torch.int32)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) & ~_LOW
    return torch.where(torch.isnan(x), x, rounded.view(torch.float32))


def bf16_round_stochastic(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Stochastic rounding to bf16 (fp32 out): round up with probability equal to the dropped fraction of an ulp,
    so E[round(x)] = x; the alternative the card names. Adds 16 uniform random bits below the kept ones, then
    truncates. Deterministic given `generator`. x: float32."""
    if x.dtype != torch.float32:
        raise InvalidInputError(f"bf16_round_stochastic takes float32, got {x.dtype}")
    noise = torch.randint(0, _LOW + 1, x.shape, generator=generator, dtype=torch.int32, device=x.device)
    rounded = (x.view(torch.int32) + noise) & ~_LOW
    return torch.where(torch.isfinite(x), rounded.view(torch.float32), x)


def identity(x: torch.Tensor) -> torch.Tensor:
    """The rounding point of exact arithmetic (fp32 or fp64 kept as is)."""
    return x


__all__ = ["bf16_round", "bf16_round_stochastic", "identity"]
