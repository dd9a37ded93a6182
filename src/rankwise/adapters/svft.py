"""SVFT (Lingam et al., NeurIPS 2024): a sparse trainable matrix M between a layer's frozen singular vectors.

For a layer W [out, in] with thin SVD W = U S Vh, keep the top-r triplets (r = config.r; r = min(out, in) is the
paper's full-spectrum setting) and learn M [r, r] with a fixed sparsity pattern:

    delta W = U_r M Vh_r        (so W' = U_r (S_r + M) Vh_r + the rest of W's spectrum, unchanged)

Pattern "banded" with `off_diag = d` trains the entries with |i - j| <= d: d = 0 is SVFT "plain" (only the
singular values move), d >= 1 is the paper's banded SVFT_B^d. Trainable parameters per layer:
r (2d + 1) - d (d + 1).

Reading chosen (see docs/methods/pica.md): M starts at zero, so the adapted model equals the base model at init,
as every rankwise adapter does. The authors' code instead draws M Kaiming-normal and multiplies it by a trainable
sigmoid gate (0.5 at init), which perturbs the model before the first step; with M = 0 that gate has no gradient
and is redundant with M's scale, so it is left out. The delta is kept additive on the unchanged W (the authors
rebuild W from U (S + M) Vh, the same weight when r is the full rank). The deployed form is a rank-r LoRA delta with
A = Vh_r, B = U_r M, scaling 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.adapters.base import Adapter, AdapterSite, LoraFactors
from rankwise.adapters.config import AdapterConfig
from rankwise.adapters.spectral import top_singular
from rankwise.errors import InvalidInputError

SVFT_PATTERNS = ("banded",)


@dataclass
class SvftConfig(AdapterConfig):
    method = "svft"  # its key in rankwise.adapters.types.ADAPTER_TYPES

    off_diag: int = 0  # 0: SVFT plain (diagonal M); d >= 1: banded with d off-diagonals on each side
    pattern: str = "banded"

    def validate(self) -> None:
        super().validate()
        if self.pattern not in SVFT_PATTERNS:
            raise InvalidInputError(f"SVFT pattern must be one of {SVFT_PATTERNS}, got {self.pattern!r}")
        if not isinstance(self.off_diag, int) or isinstance(self.off_diag, bool) or self.off_diag < 0:
            raise InvalidInputError(f"SVFT off_diag must be an integer >= 0, got {self.off_diag!r}")
        if self.off_diag >= self.r:
            raise InvalidInputError(f"SVFT off_diag={self.off_diag} must be below the rank r={self.r} (a band wider "
                                    "than M is just a dense M)")


def banded_pattern(r: int, off_diag: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) [nnz] of the entries of an r x r matrix with |row - col| <= off_diag, diagonal first."""
    rows, cols = [], []
    for offset in [0, *(o for d in range(1, off_diag + 1) for o in (d, -d))]:
        i = torch.arange(max(0, -offset), min(r, r - offset))
        rows.append(i)
        cols.append(i + offset)
    return torch.cat(rows), torch.cat(cols)


def svft_parameter_count(r: int, off_diag: int) -> int:
    """Trainable entries of one layer's banded M: r (2d + 1) - d (d + 1)."""
    return r * (2 * off_diag + 1) - off_diag * (off_diag + 1)


class SvftAdapter(Adapter):
    """Buffers U [out, r], Vh [r, in], rows/cols [nnz] (frozen); parameter m [nnz] (trainable, zero at init)."""

    method = "svft"
    config_class = SvftConfig

    def __init__(self, site: AdapterSite, config: SvftConfig, initialize: bool = True) -> None:
        super().__init__(site, config, initialize)
        r, dtype = config.r, site.base.weight.dtype
        rows, cols = banded_pattern(r, config.off_diag)
        self.r = r
        self.register_buffer("U", torch.empty(site.out_features, r, dtype=dtype))
        self.register_buffer("Vh", torch.empty(r, site.in_features, dtype=dtype))
        self.register_buffer("rows", rows)
        self.register_buffer("cols", cols)
        self.m = nn.Parameter(torch.zeros(rows.numel(), dtype=dtype))
        if initialize:
            u, _, vh = top_singular(site.base.weight, r)
            self.U.copy_(u.to(dtype))
            self.Vh.copy_(vh.to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = F.linear(x, self.Vh)  # [..., r]: coordinates on the right singular vectors
        # Sparse M z without a dense M: gather z at each entry's column, scale, add into its row.
        mz = torch.zeros_like(z).index_add(-1, self.rows, z.index_select(-1, self.cols) * self.m)
        return F.linear(mz, self.U)

    def dense_m(self) -> torch.Tensor:
        """M as a dense [r, r] matrix (differentiable in m)."""
        return torch.zeros(self.r, self.r, dtype=self.m.dtype, device=self.m.device).index_put(
            (self.rows, self.cols), self.m, accumulate=True)

    def delta_weight(self) -> torch.Tensor:
        return self.U @ self.dense_m() @ self.Vh

    def lora_factors(self) -> LoraFactors:
        return LoraFactors(self.Vh.detach(), (self.U @ self.dense_m()).detach(), 1.0)
