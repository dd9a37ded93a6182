"""The scalar activations a component MLP may use, by name.

Periodic ones (`sine`, `spder`, `sinarctan`) are what high-frequency targets need (the card's ablation: non-periodic
components show strong spectral bias); `tanh` is that ablation's arm, `identity` makes a component affine (g(t) = t
for exact-representation checks).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rankwise.errors import UnknownNameError


def _spder(x: torch.Tensor) -> torch.Tensor:
    # sin(x) * sqrt(|x|). The clamp keeps the gradient finite at x = 0, where d sqrt(|x|)/dx is infinite but the
    # product's derivative is not (sin(x)/sqrt|x| -> 0); the clamped branch's gradient is 0 there.
    return torch.sin(x) * torch.sqrt(x.abs().clamp_min(1e-12))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sine": torch.sin,
    "spder": _spder,
    "sinarctan": lambda x: torch.sin(x) * torch.atan(x),
    "tanh": torch.tanh,
    "identity": lambda x: x,
}


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation called `name` (one of `ACTIVATIONS`), else `UnknownNameError`."""
    if name not in ACTIVATIONS:
        raise UnknownNameError(f"no component activation {name!r}; known: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]
