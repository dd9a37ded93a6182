"""What a flash-attention call computes in: exact arithmetic, or emulated bf16 with the paper's fix and the
alternatives the card names."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rankwise.errors import InvalidInputError

PRECISIONS = ("exact", "bf16")
ACCUMULATIONS = ("bf16", "fp32")
ROUNDINGS = ("nearest", "stochastic")


@dataclass(frozen=True)
class FlashConfig:
    """precision:    "exact" computes in the inputs' dtype with no rounding (fp32: SDPA to rounding); "bf16" emulates
                     a bf16 kernel (q, k, v, the scores S and P̄ rounded to bf16; statistics m, ℓ in fp32).
    accumulation: (bf16 only) "bf16": each tile's P̄V, accumulated in fp32, is rounded to bf16, and so is the running
                     output (the pure-PyTorch FA2 under autocast the paper studies); "fp32": P̄V and O stay fp32
                     and O is rounded once at the end, δ = rowsum(dO ∘ O) reads the fp32 O (the card's alternative).
    rounding:     (bf16 only) "nearest" (RNE) or "stochastic" at the output rounding points (P̄V, O).
    fix:          the paper's minimal fix: a key tile whose row max m is tied (> 1 score within `tie_tol` of it) is
                     shifted by β·m (m > 0) or 0 (m < 0) instead of m, so no P̄ equals 1; exact results unchanged.
    beta:         β > 1 (the official code's 2). tie_tol: absolute, on the scaled scores (the code's 1e-3).
    tile_q, tile_k: rows of the query and key tiles. causal: key j sees query i only when j <= i (+ Tk - Tq).
    """

    precision: str = "exact"
    accumulation: str = "bf16"
    rounding: str = "nearest"
    fix: bool = False
    beta: float = 2.0
    tie_tol: float = 1e-3
    tile_q: int = 64
    tile_k: int = 64
    causal: bool = False
    min_rowsum: float = 1e-10  # ℓ is clamped here (the code's guard: a too large β underflows a whole row)

    def __post_init__(self) -> None:
        for name, value, allowed in (("precision", self.precision, PRECISIONS),
                                     ("accumulation", self.accumulation, ACCUMULATIONS),
                                     ("rounding", self.rounding, ROUNDINGS)):
            if value not in allowed:
                raise InvalidInputError(f"{name} must be one of {list(allowed)}, got {value!r}")
        for name in ("tile_q", "tile_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise InvalidInputError(f"{name} must be a positive int (rows per tile), got {v!r}")
        if not (math.isfinite(self.beta) and self.beta > 1.0):
            raise InvalidInputError(f"beta must be finite and > 1 (β = 1 leaves P̄ = 1 at a tie), got {self.beta!r}")
        if not (math.isfinite(self.tie_tol) and self.tie_tol >= 0):
            raise InvalidInputError(f"tie_tol must be finite and >= 0, got {self.tie_tol!r}")
        if not self.min_rowsum > 0:
            raise InvalidInputError(f"min_rowsum must be > 0, got {self.min_rowsum!r}")

    @property
    def emulated(self) -> bool:
        return self.precision == "bf16"


__all__ = ["FlashConfig", "PRECISIONS", "ACCUMULATIONS", "ROUNDINGS"]
