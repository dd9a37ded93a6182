"""The card's diagnostics: weight alignment (WA) and gradient alignment (GA), cosines of flattened tensors.

- WA of a middle layer l of the chain: cos(vec W_l, vec(F_l F_{l-1}ᵀ)); of the output layer: cos(vec W_L,
  vec F_{L-1}ᵀ). "Strong WA" is WA = 1 (what weight matching sets at t = 0).
- GA of a layer: cos(vec ΔW_l^DFA, vec ΔW_l^BP), the DFA update against backprop's gradient on the same batch
  (weight decay left out of both); the output layer's is 1 by construction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from rankwise.errors import InvalidInputError


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """cos(vec a, vec b) in float64, in [-1, 1]; 0.0 when either is zero (no direction to align)."""
    if a.numel() != b.numel():
        raise InvalidInputError(f"cosine of tensors of {a.numel()} and {b.numel()} elements")
    x, y = a.detach().reshape(-1).to(torch.float64), b.detach().reshape(-1).to(torch.float64)
    nx, ny = torch.linalg.vector_norm(x), torch.linalg.vector_norm(y)
    if nx == 0 or ny == 0:
        return 0.0
    return float((x @ y / (nx * ny)).clamp(-1.0, 1.0))


def weight_alignment(weights: Sequence[torch.Tensor], feedbacks: Sequence[torch.Tensor]) -> list[float]:
    """WA of layers 2 .. L of a chain (`weights` W_1 .. W_L, `feedbacks` F_1 .. F_{L-1}): L-1 values, the output
    layer's last. W_1 has none (nothing constrains it)."""
    if len(feedbacks) != len(weights) - 1 or len(weights) < 2:
        raise InvalidInputError(f"{len(weights)} weights need {len(weights) - 1} feedback matrices, got {len(feedbacks)}")
    out = []
    for i in range(1, len(weights) - 1):
        target = feedbacks[i].to(torch.float64) @ feedbacks[i - 1].to(torch.float64).T
        out.append(cosine(weights[i], target))
    out.append(cosine(weights[-1], feedbacks[-1].T))
    return out


def gradient_alignment(dfa: Mapping[str, torch.Tensor], bp: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """GA per layer name: cos(DFA gradient, BP gradient), over the names both hold."""
    missing = sorted(set(dfa) ^ set(bp))
    if missing:
        raise InvalidInputError(f"gradient alignment needs both gradients of every layer; only one of them has {missing}")
    return {name: cosine(dfa[name], bp[name]) for name in dfa}
