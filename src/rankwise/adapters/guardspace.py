"""GuardSpace (Zhang et al., ICLR 2026): an adapter that cannot change a layer's output on protected inputs.

Built from the uncentred second moment C [in, in] of the layer's inputs on a *protected* prompt set (the paper: harmful
prompts whose refusals must survive fine-tuning; collect it with `rankwise.core.calibration.collect_second_moments` on
the unadapted model, over prompt and response tokens, and pass it as `add_adapter(..., statistics=...)`):

1. Safety-sensitive subspace init: the r smallest components of the covariance-preconditioned SVD of W become the
   initial factors B0 [out, r], A0 [r, in] (see `guardspace_split.py`); the large ones stay frozen.
2. Harmful-resistant null space: P = Qhat^T Qhat [in, in] projects onto the inputs' (thresholded) null space.
3. The paper's frozen weight is W' = W - s B0 A0 P and the layer computes (W' + s B A P) x. We keep W untouched and
   add the delta s (B A - B0 A0) P x instead (identical outputs; disable/merge/delete stay exact). Since P X = 0,
   the layer's output on every protected input equals the base's whatever A, B become; with every adapted layer
   guarded, the protected sequences' logits are unchanged by induction over layers.

Only A and B train (trainable parameters r * (in + out), exactly LoRA's). The deployed form is a rank-2r LoRA delta
[B, -B0] @ [A P; A0 P] * s, so PEFT loads it on the original base model. Ablations: `init="lora"` (LoRA's init,
B0 A0 = 0, projector only) and `projector=False` (no P: CorDA's knowledge-preserving init only).
P is stored as its basis Qhat [k, in] (k = null-space dimension, per layer), never as a dense [in, in] matrix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.adapters.base import Adapter, AdapterSite, LoraFactors
from rankwise.adapters.config import AdapterConfig
from rankwise.adapters.guardspace_split import guarded_split, null_space_basis
from rankwise.core.linalg import symmetric_eigh
from rankwise.errors import InvalidInputError

GUARDSPACE_INITS = ("guardspace", "lora")


@dataclass
class GuardSpaceConfig(AdapterConfig):
    method = "guardspace"  # its key in rankwise.adapters.types.ADAPTER_TYPES

    lora_alpha: float = 8.0  # scaling s = lora_alpha / r, as LoRA (the init is divided by s so s B0 A0 = M_r)
    init: str = "guardspace"  # "guardspace": r smallest preconditioned components; "lora": LoRA's init (ablation)
    projector: bool = True  # False: no null-space projector (ablation: CorDA knowledge-preserving init only)
    # eigenvalues of C <= tau * lambda_max span the null space. 1e-6: chosen on validation in the guardspace
    # reproduction (1e-5 and above let overwrite data move the protected answers; the card proposed 1e-4..1e-3)
    null_threshold: float = 1e-6
    damping: float = 1e-6  # starting relative diagonal loading of C for the split (raised x10 until exact)
    balanced: bool = True  # equal-norm factors per component (product unchanged); False: the card's sqrt(S) split

    def validate(self) -> None:
        super().validate()
        if self.init not in GUARDSPACE_INITS:
            raise InvalidInputError(f"GuardSpace init must be one of {GUARDSPACE_INITS}, got {self.init!r}")
        if not (self.null_threshold >= 0 and math.isfinite(self.null_threshold)):
            raise InvalidInputError(f"null_threshold must be a finite number >= 0, got {self.null_threshold}")
        if not self.damping > 0:
            raise InvalidInputError(f"damping must be > 0 (C is rank-deficient by design), got {self.damping}")
        if not self.lora_alpha > 0:
            raise InvalidInputError(f"lora_alpha must be > 0, got {self.lora_alpha}")

    @property
    def scaling(self) -> float:
        return self.lora_alpha / self.r


class GuardSpaceAdapter(Adapter):
    """Trainable A [r, in], B [out, r]; frozen A0 [r, in], B0 [out, r] (initial factors) and Q [k, in] (null basis)."""

    method = "guardspace"
    config_class = GuardSpaceConfig
    needs_statistics = True

    def __init__(self, site: AdapterSite, config: GuardSpaceConfig, initialize: bool = True) -> None:
        super().__init__(site, config, initialize)
        r, d_in, d_out = config.r, site.in_features, site.out_features
        dtype = site.base.weight.dtype
        self.scaling = config.scaling
        self.projector = config.projector
        self.has_initial = config.init == "guardspace"
        self.A = nn.Parameter(torch.empty(r, d_in, dtype=dtype))
        self.B = nn.Parameter(torch.empty(d_out, r, dtype=dtype))
        if self.has_initial:
            self.register_buffer("A0", torch.empty(r, d_in, dtype=dtype))
            self.register_buffer("B0", torch.empty(d_out, r, dtype=dtype))
        if self.projector:
            self.register_buffer("Q", torch.empty(0, d_in, dtype=dtype))  # resized by init or prepare_load
        self.damping_used: float | None = None
        if initialize:
            self.reset(site, config)

    @torch.no_grad()
    def reset(self, site: AdapterSite, config: GuardSpaceConfig) -> None:
        if site.statistics is None:
            raise InvalidInputError(f"GuardSpace needs protected-input statistics for {site.module_name}")
        if site.statistics.dim != site.in_features:
            raise InvalidInputError(
                f"statistics for {site.module_name} are {site.statistics.dim}-dimensional but the layer has "
                f"{site.in_features} inputs; collect them at this module's input (forward pre-hook)"
            )
        eig = symmetric_eigh(site.statistics.covariance())
        dtype = site.base.weight.dtype
        if self.projector:
            basis = null_space_basis(eig, config.null_threshold)
            if basis.size(0) == 0:
                raise InvalidInputError(
                    f"the protected inputs of {site.module_name} span all {site.in_features} dimensions at "
                    f"null_threshold={config.null_threshold}: the projector would be zero and the adapter could not "
                    f"learn; use fewer protected tokens or a larger null_threshold"
                )
            self.Q = basis.to(dtype)
        if self.has_initial:
            split = guarded_split(site.base.weight, eig, config.r, config.damping, config.balanced)
            root = math.sqrt(self.scaling)
            self.A.copy_(split.A0 / root)
            self.B.copy_(split.B0 / root)
            self.A0.copy_(self.A)
            self.B0.copy_(self.B)
            self.damping_used = split.damping
        else:  # LoRA's default init and RNG order (see lora.py)
            nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
            nn.init.kaiming_uniform_(self.B, a=math.sqrt(5))
            nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
            nn.init.zeros_(self.B)

    def prepare_load(self, state: Mapping[str, torch.Tensor]) -> None:
        """Size the null basis from the saved tensors before the loader fills them (its k is data-dependent)."""
        if self.projector and "Q" in state:
            self.Q = torch.empty(state["Q"].shape, dtype=self.A.dtype)

    def project(self, a: torch.Tensor) -> torch.Tensor:
        """a [m, in] -> a P [m, in], with P = Q^T Q (identity without the projector)."""
        if not self.projector:
            return a
        return (a @ self.Q.T) @ self.Q

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Row-side projection (A P, [r, in]) costs r*in*k per call instead of in*k per token.
        out = F.linear(F.linear(x, self.project(self.A)), self.B)
        if self.has_initial:
            # A == A0 and B == B0 at init give bit-identical terms, so the initial delta is exactly zero.
            out = out - F.linear(F.linear(x, self.project(self.A0)), self.B0)
        return out * self.scaling

    def delta_weight(self) -> torch.Tensor:
        delta = self.B @ self.project(self.A)
        if self.has_initial:
            delta = delta - self.B0 @ self.project(self.A0)
        return delta * self.scaling

    def lora_factors(self) -> LoraFactors:
        A, B = self.project(self.A.detach()), self.B.detach()
        if self.has_initial:
            A = torch.cat([A, self.project(self.A0)])
            B = torch.cat([B, -self.B0], dim=1)
        return LoraFactors(A.contiguous(), B.contiguous(), self.scaling)

    @property
    def null_dim(self) -> int:
        """Dimension k of the protected null space (in_features without the projector)."""
        return self.Q.size(0) if self.projector else self.A.size(1)
