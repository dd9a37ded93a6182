"""PiCa (Hwang, Cho, Kim, ICLR 2026): updates confined to each layer's principal input subspace, one trainable
matrix shared by all layers of the same module type.

For a layer W [out, in] with SVD W = U S Vh, the frozen projector is P = Vh[:r] [r, in] (the paper writes layers as
Y = X W, so its "column space" / left singular vectors are the input side of PyTorch's weight). The update is
delta W = M_f P with M_f [out, r] trainable, zero at init, and shared by every layer whose name differs only in the
layer index (module type f). No scaling, no dropout. Trainable parameters: sum over types of out(f) * r, whatever
the depth. The deployed form is a LoRA delta with A = P, B = M_f, scaling 1, so PEFT loads it.

`subspace="random"` replaces P with a random orthonormal basis of the same shape (the paper's ablation);
`share=False` gives every layer its own M (the no-sharing ablation).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from rankwise.adapters.base import Adapter, AdapterSite, LoraFactors
from rankwise.adapters.config import AdapterConfig
from rankwise.adapters.spectral import top_singular
from rankwise.errors import InvalidInputError

PICA_SUBSPACES = ("principal", "random")


@dataclass
class PicaConfig(AdapterConfig):
    method = "pica"  # its key in rankwise.adapters.types.ADAPTER_TYPES

    share: bool = True  # one M per module type (the method); False: one per layer (ablation)
    subspace: str = "principal"  # "principal": top-r right singular vectors of W; "random": random orthonormal
    seed: int = 0  # for subspace="random"

    def validate(self) -> None:
        super().validate()
        if self.subspace not in PICA_SUBSPACES:
            raise InvalidInputError(f"PiCa subspace must be one of {PICA_SUBSPACES}, got {self.subspace!r}")


class PicaAdapter(Adapter):
    """Buffer P [r, in] (frozen, per layer); parameter M [out, r] (trainable, shared per module type)."""

    method = "pica"
    config_class = PicaConfig

    def __init__(self, site: AdapterSite, config: PicaConfig, initialize: bool = True) -> None:
        super().__init__(site, config, initialize)
        r, d_in, d_out = config.r, site.in_features, site.out_features
        dtype = site.base.weight.dtype
        self.register_buffer("P", torch.empty(r, d_in, dtype=dtype))
        if initialize:
            self.P.copy_(principal_projector(site.base.weight, r) if config.subspace == "principal" else
                         random_projector(r, d_in, config.seed, site.module_name).to(dtype))
        key = site.module_type if config.share else site.module_name
        shared = site.shared_parameter(f"M:{key}", lambda: torch.zeros(d_out, r, dtype=dtype))
        if shared.shape != (d_out, r):
            raise InvalidInputError(
                f"PiCa shares M across {key!r} but {site.module_name} has {d_out} outputs while M has shape "
                f"{tuple(shared.shape)}; layers of one module type must have equal output sizes (use share=False)"
            )
        self.use_shared("M", shared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, self.P), self.M)

    def delta_weight(self) -> torch.Tensor:
        return self.M @ self.P

    def lora_factors(self) -> LoraFactors:
        return LoraFactors(self.P.detach(), self.M.detach(), 1.0)


def principal_projector(weight: torch.Tensor, r: int) -> torch.Tensor:
    """Top-r right singular vectors of W [out, in] as rows: P [r, in] with orthonormal rows (float64 inside)."""
    _, _, vh = top_singular(weight, r)
    return vh.to(weight.dtype)


def random_projector(r: int, d_in: int, seed: int, module_name: str) -> torch.Tensor:
    """A random r-dimensional orthonormal basis of R^d_in as rows [r, in], fixed by (seed, module name)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(module_name.encode()))
    q, _ = torch.linalg.qr(torch.randn(d_in, r, generator=gen, dtype=torch.float64))
    return q.T.contiguous()
