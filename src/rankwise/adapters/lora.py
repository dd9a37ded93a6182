"""LoRA (Hu et al. 2021): delta = (alpha / r) * B @ A, the baseline every adapter method is compared against.

Initialisations:
- "default": A Kaiming-uniform (a=sqrt(5)), B = 0, drawing from torch's global RNG in exactly the order PEFT does
  (PEFT builds A and B as nn.Linear, which draws both once, then redraws A), so the same seed gives the same
  adapter as `peft.get_peft_model` — see tests/adapters/test_adapters_peft.py.
- "gaussian": A ~ N(0, 1/r^2), B = 0 (PEFT's "gaussian"), same RNG order.
- "pissa": A, B from the top-r singular triplets of W (Meng et al. 2024, PEFT's "pissa"). PEFT subtracts the initial
  product from the base weight; we keep the base weight untouched and subtract a frozen copy of the initial product
  in the forward instead, so the delta is `s (B A - B0 A0)` — identical outputs, and the deployed form is an exact
  rank-2r LoRA delta [B, -B0] @ [A; A0] that PEFT loads on the *original* base model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.adapters.base import Adapter, AdapterSite, LoraFactors
from rankwise.adapters.config import AdapterConfig
from rankwise.adapters.spectral import top_singular
from rankwise.errors import InvalidInputError

LORA_INITS = ("default", "gaussian", "pissa")


@dataclass
class LoraConfig(AdapterConfig):
    method = "lora"  # its key in rankwise.adapters.types.ADAPTER_TYPES

    lora_alpha: float = 8.0
    lora_dropout: float = 0.0
    init: str = "default"  # one of LORA_INITS
    use_rslora: bool = False  # scaling alpha / sqrt(r) instead of alpha / r

    def validate(self) -> None:
        super().validate()
        if self.init not in LORA_INITS:
            raise InvalidInputError(f"LoRA init must be one of {LORA_INITS}, got {self.init!r}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise InvalidInputError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")

    @property
    def scaling(self) -> float:
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)


class LoraAdapter(Adapter):
    """A [r, in], B [out, r] trainable; for PiSSA also frozen A0, B0 (the initial factors)."""

    method = "lora"
    config_class = LoraConfig

    def __init__(self, site: AdapterSite, config: LoraConfig, initialize: bool = True) -> None:
        super().__init__(site, config, initialize)
        r, d_in, d_out = config.r, site.in_features, site.out_features
        self.scaling = config.scaling
        self.dropout = nn.Dropout(config.lora_dropout) if config.lora_dropout > 0 else nn.Identity()
        dtype = site.base.weight.dtype
        self.A = nn.Parameter(torch.empty(r, d_in, dtype=dtype))
        self.B = nn.Parameter(torch.empty(d_out, r, dtype=dtype))
        self.pissa = config.init == "pissa"
        if self.pissa:
            self.register_buffer("A0", torch.empty(r, d_in, dtype=dtype))
            self.register_buffer("B0", torch.empty(d_out, r, dtype=dtype))
        if initialize:
            self.reset(site, config)

    @torch.no_grad()
    def reset(self, site: AdapterSite, config: LoraConfig) -> None:
        if config.init == "pissa":
            A, B = pissa_factors(site.base.weight, config.r, self.scaling)
            self.A.copy_(A)
            self.B.copy_(B)
            self.A0.copy_(A)
            self.B0.copy_(B)
            return
        # PEFT's RNG order: nn.Linear(in, r) and nn.Linear(r, out) each draw their default init, then A is redrawn.
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        nn.init.kaiming_uniform_(self.B, a=math.sqrt(5))
        if config.init == "default":
            nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        else:
            nn.init.normal_(self.A, std=1 / config.r)
        nn.init.zeros_(self.B)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Same operation order as PEFT (B(A(dropout(x))) * scaling) so results agree bit for bit.
        x = self.dropout(x)
        out = F.linear(F.linear(x, self.A), self.B) * self.scaling
        if self.pissa:
            out = out - F.linear(F.linear(x, self.A0), self.B0) * self.scaling
        return out

    def delta_weight(self) -> torch.Tensor:
        delta = self.B @ self.A
        if self.pissa:
            delta = delta - self.B0 @ self.A0
        return delta * self.scaling

    def lora_factors(self) -> LoraFactors:
        if self.pissa:
            return LoraFactors(torch.cat([self.A, self.A0]).detach(), torch.cat([self.B, -self.B0], dim=1).detach(), self.scaling)
        return LoraFactors(self.A.detach(), self.B.detach(), self.scaling)


def pissa_factors(weight: torch.Tensor, r: int, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Principal singular factors of W [out, in]: A = sqrt(S_r/s) Vh_r [r, in], B = U_r sqrt(S_r/s) [out, r], so that
    s * B @ A is the best rank-r approximation of W. Computed in float64, returned in W's dtype."""
    U, S, Vh = top_singular(weight, r)
    root = (S / scaling).sqrt()
    return (root[:, None] * Vh).to(weight.dtype), (U * root[None, :]).to(weight.dtype)
