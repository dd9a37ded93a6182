"""Rotary position embedding, in the two pairing conventions a target model may use.

`half` (HF Llama, GPT-NeoX, SmolLM2): dimension j is paired with j + rotary_dim/2. `adjacent` (GPT-J, Meta's
original Llama): dimension 2j with 2j+1. Only the first `rotary_dim` dimensions rotate (Pythia rotates 16 of 64);
the rest pass through. A mismatch with the target model silently wrecks a fit, so the convention is explicit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.errors import InvalidInputError

CONVENTIONS = ("half", "adjacent")


@dataclass(frozen=True)
class Rope:
    """RoPE settings: rotate the first `rotary_dim` dims (0 = no RoPE) with frequencies base^(-2j/rotary_dim)."""

    rotary_dim: int = 0
    base: float = 10000.0
    convention: str = "half"

    def __post_init__(self) -> None:
        if self.rotary_dim < 0 or self.rotary_dim % 2:
            raise InvalidInputError(f"rotary_dim must be an even number >= 0, got {self.rotary_dim}")
        if self.convention not in CONVENTIONS:
            raise InvalidInputError(f"RoPE convention must be one of {CONVENTIONS}, got {self.convention!r}")
        if not self.base > 0:
            raise InvalidInputError(f"RoPE base must be positive, got {self.base}")

    def check_fits(self, head_dim: int) -> None:
        if self.rotary_dim > head_dim:
            raise InvalidInputError(f"rotary_dim {self.rotary_dim} exceeds the head dimension {head_dim}")

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x [batch, heads, seq, head_dim] at positions 0..seq-1 -> the same shape, rotated."""
        r = self.rotary_dim
        if r == 0:
            return x
        seq = x.size(-2)
        # Angles in float64 then cast: positions * frequencies loses digits in fp32 at long contexts.
        inv_freq = self.base ** (-torch.arange(0, r, 2, dtype=torch.float64, device=x.device) / r)
        angles = torch.arange(seq, dtype=torch.float64, device=x.device)[:, None] * inv_freq[None, :]  # [seq, r/2]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        rot, rest = x[..., :r], x[..., r:]
        if self.convention == "half":
            a, b = rot[..., : r // 2], rot[..., r // 2:]
            out = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
        else:
            a, b = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
        return torch.cat((out, rest), dim=-1)

    def to_dict(self) -> dict:
        return {"rotary_dim": self.rotary_dim, "base": self.base, "convention": self.convention}
