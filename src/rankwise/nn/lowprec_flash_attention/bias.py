"""The rounding-bias measurement: the card's microbenchmark (A) of the emulated kernel against float64.

Synthetic attention rows in groups that share one V (the [B, H, T, D] layout, H = 1): each row has `ties` keys at
its maximum score m (so P̄ = 1 exactly without the fix) and the rest 6-12 below it (P̄ in [6e-6, 2.5e-3], the small
same-sign residue that pushes a tie past the midpoint); V ~ N(mean, std) per entry. S and V are bf16 values, the
reference computes the exact softmax of the same values in float64.

The bias is read in units of bf16's unit roundoff u = 2^-8, as the mean *magnitude* error
    b = mean( sign(O_ref) (O - O_ref) / |O_ref| ) / u         (> 0: rounded away from zero, the paper's direction)
with its t statistic over rows, the signed mean error, and the row-sum error exp(lse - lse_ref) - 1 in u.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rankwise.errors import InvalidInputError
from rankwise.nn.lowprec_flash_attention.config import FlashConfig
from rankwise.nn.lowprec_flash_attention.kernel import forward_from_scores, rounders
from rankwise.nn.lowprec_flash_attention.rounding import bf16_round

UNIT_ROUNDOFF = 2.0 ** -8  # bf16: 8 significand bits, u = 2^-8


@dataclass(frozen=True)
class BiasCase:
    """One synthetic configuration. ties: (lo, hi) keys tied at the row max (hi inclusive); v_mean, v_std: V's
    entries; max_range: the row max m ~ U(lo, hi) on the scaled scores (the fix shifts by β·m for m > 0)."""

    keys: int = 256
    head_dim: int = 16
    ties: tuple[int, int] = (2, 4)
    v_mean: float = -0.5
    v_std: float = 0.05
    max_range: tuple[float, float] = (0.5, 3.0)
    gap: tuple[float, float] = (6.0, 12.0)
    rows_per_group: int = 256

    def __post_init__(self) -> None:
        if not 1 <= self.ties[0] <= self.ties[1] <= self.keys:
            raise InvalidInputError(f"ties must satisfy 1 <= lo <= hi <= keys, got {self.ties} with {self.keys} keys")
        if self.head_dim < 1 or self.rows_per_group < 1 or self.v_std < 0:
            raise InvalidInputError(f"bad bias case {self}")


@dataclass(frozen=True)
class BiasReading:
    magnitude_bias_u: float  # b above
    t_stat: float  # of b over rows
    signed_error: float  # mean(O - O_ref)
    rowsum_error_u: float  # mean(exp(lse - lse_ref) - 1) / u
    rows: int


def synthetic_rows(case: BiasCase, rows: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(S [G, R, N], V [G, N, D]), float32 holding bf16 values, G * R >= rows."""
    g = max(1, math.ceil(rows / case.rows_per_group))
    r, n = case.rows_per_group, case.keys
    lo, hi = case.max_range
    m = bf16_round(lo + (hi - lo) * torch.rand(g, r, 1, generator=generator))
    s = m - (case.gap[0] + (case.gap[1] - case.gap[0]) * torch.rand(g, r, n, generator=generator))
    ties = torch.randint(case.ties[0], case.ties[1] + 1, (g, r, 1), generator=generator)
    rank = torch.rand(g, r, n, generator=generator).argsort(-1).argsort(-1)  # a random permutation per row
    s = torch.where(rank < ties, m, s)
    v = case.v_mean + case.v_std * torch.randn(g, n, case.head_dim, generator=generator)
    return bf16_round(s), bf16_round(v)


def measure_bias(s: torch.Tensor, v: torch.Tensor, cfg: FlashConfig,
                 generator: torch.Generator | None = None) -> BiasReading:
    """The kernel's output on the given scores (S [G, R, N], V [G, N, D], bf16 values) against float64."""
    r = rounders(cfg, generator)
    out, lse, _, _ = forward_from_scores(lambda i0, i1, j0, j1: s[..., i0:i1, j0:j1], v, s.shape[-2], cfg, r)
    s64, v64 = s.double(), v.double()
    lse_ref = torch.logsumexp(s64, -1)
    o_ref = torch.softmax(s64, -1) @ v64
    rel = torch.sign(o_ref) * (out.double() - o_ref) / o_ref.abs().clamp_min(1e-300) / UNIT_ROUNDOFF
    per_row = rel.mean(-1).flatten()
    n = per_row.numel()
    sd = float(per_row.std()) if n > 1 else float("nan")
    mean = float(per_row.mean())
    return BiasReading(mean, mean / (sd / math.sqrt(n)) if sd > 0 else float("inf") * (1 if mean else 0),
                       float((out.double() - o_ref).mean()),
                       float(torch.expm1(lse.double() - lse_ref).mean() / UNIT_ROUNDOFF), n)


__all__ = ["BiasCase", "BiasReading", "UNIT_ROUNDOFF", "synthetic_rows", "measure_bias"]
