"""LMAO (Zhang et al., ICLR 2026, "Three Forward, One Backward"): per iteration, a first-order step on the LoRA
factors (1 forward + 1 backward), then a zeroth-order SPSA step (`zeroth_order.SPSA`, 2 forwards) on the frozen base
weights W at the *updated* factors, on the same batch. The sum of the two updates is full rank; memory stays at the
LoRA level because the ZO phase keeps no activations.

This file holds the method's settings and which tensors are "W". The loop integration (the ZO phase as the training
loop's `after_step` hook) is `rankwise.optim.lmao.procedure`.

What "W" is (`LmaoConfig.params`):
- "all" (default, the authors' code): every frozen floating-point parameter of the trained module — embeddings,
  LayerNorms and biases included (their trainer perturbs every parameter whose name lacks "lora");
- "linear": only the weights and biases of linear layers (`nn.Linear`, or the base layer of an adapted linear);
- "matrices": only the 2-D tensors (linear weights and embeddings; no biases, no LayerNorms).
`top_k_layers` further restricts W to the top K layers of the transformer stack (a cheaper, documented variant).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from rankwise.core.options import option
from rankwise.errors import InvalidInputError
from rankwise.optim.zeroth_order import PERTURBATIONS

BASE_PARAMS = ("all", "linear", "matrices")


@dataclass(frozen=True)
class LmaoConfig:
    """The ZO phase's settings; the LoRA phase's are the training loop's (lr, schedule, clipping)."""

    base_lr: float = 1e-6  # eta_W: plain SGD, constant (the reference code does not schedule it)
    eps: float = 1e-3  # SPSA perturbation scale (the paper's 1e-3)
    weight_decay: float = 0.0  # on W's tensors of dim >= 2 (the paper's 0)
    params: str = field(default="all", metadata=option(choices=BASE_PARAMS))  # which frozen tensors are W; see the module docstring
    top_k_layers: int | None = None  # None: every layer; K: only the top K layers' tensors
    perturbation: str = field(default="exact", metadata=option(choices=PERTURBATIONS))  # "exact" (W untouched during the forwards) or "in-place" (MeZO's +eps, -2eps, +eps)

    def validate(self) -> None:
        for name in ("base_lr", "eps", "weight_decay"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InvalidInputError(f"LMAO {name} must be a finite number >= 0, got {v!r}")
        if self.eps <= 0:
            raise InvalidInputError(f"LMAO eps must be > 0 (the SPSA difference divides by it), got {self.eps!r}")
        if self.params not in BASE_PARAMS:
            raise InvalidInputError(f"LMAO params must be one of {BASE_PARAMS}, got {self.params!r}")
        if self.top_k_layers is not None and (isinstance(self.top_k_layers, bool) or not isinstance(self.top_k_layers, int)
                                              or self.top_k_layers < 1):
            raise InvalidInputError(f"LMAO top_k_layers must be a positive integer or None, got {self.top_k_layers!r}")
        if self.perturbation not in PERTURBATIONS:
            raise InvalidInputError(f"LMAO perturbation must be one of {PERTURBATIONS}, got {self.perturbation!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def select_base_tensors(module: nn.Module, params: str = "all",
                        keep: Callable[[str], bool] | None = None) -> list[tuple[str, nn.Parameter]]:
    """W: the frozen floating-point parameters of `module` of the kind `params`, in `named_parameters` order (tied
    weights once), optionally filtered by name with `keep` (e.g. "in the top K layers").

    Linear layers are recognised as modules with a 2-D `weight` and `in_features` (nn.Linear and adapted linears,
    whose own parameters live in their `base_layer`)."""
    if params not in BASE_PARAMS:
        raise InvalidInputError(f"params must be one of {BASE_PARAMS}, got {params!r}")
    linear: set[int] = set()
    for m in module.modules():
        if isinstance(m, nn.Linear):
            linear.update(id(p) for p in m.parameters(recurse=False))
    chosen = []
    for name, p in module.named_parameters():
        if p.requires_grad or not p.is_floating_point():
            continue
        if params == "linear" and id(p) not in linear:
            continue
        if params == "matrices" and p.dim() != 2:
            continue
        if keep is not None and not keep(name):
            continue
        chosen.append((name, p))
    if not chosen:
        raise InvalidInputError(f"no frozen tensors match LMAO's W selection (params={params!r}"
                                f"{', with the layer filter' if keep else ''}): nothing for the zeroth-order phase")
    return chosen


def base_snapshot(tensors: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Copies of W by name (to measure the base update W_T - W_0 afterwards)."""
    return {n: p.detach().clone() for n, p in tensors}
