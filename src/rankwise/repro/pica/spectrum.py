"""Experiment A's measurement: how much of a full fine-tuning update lies in PiCa's subspace, against the update's
own best rank-r energy (the quantity PiCa's Theorem 1 bounds, by Eckart-Young).

For a layer with pretrained W0 [out, in] and update dW = W* - W0 (float64):
- PiCa's share   rho_pica(r) = ||dW P_r^T P_r||_F^2 / ||dW||_F^2, P_r the top-r right singular vectors of W0;
- the optimum    rho_best(r) = sum_{i<=r} sigma_i(dW)^2 / ||dW||_F^2 (no rank-r subspace captures more);
- the theorem's statement is rho_pica(r) >= rho_best(r) - O(eps): the ratio rho_pica / rho_best near 1.
The random-subspace share r / in (the expected rho of a uniformly random r-dimensional input subspace) is kept as
context only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.adapters.pica import principal_projector
from rankwise.errors import InvalidInputError


@dataclass(frozen=True)
class LayerEnergy:
    """Energy shares of one layer's update at one rank r."""

    name: str
    r: int
    pica: float  # rho_pica(r)
    best: float  # rho_best(r)
    random: float  # r / in
    relative_update: float  # ||dW||_F / ||W0||_F (the theorem's perturbation is small when this is)

    @property
    def ratio_to_best(self) -> float:
        return self.pica / self.best


def update_energy(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], ranks: tuple[int, ...]) -> list[LayerEnergy]:
    """Per layer (W0 [out, in] in `before`, W* in `after`, same keys) and per r in `ranks`: the shares above."""
    if set(before) != set(after):
        raise InvalidInputError("before and after must hold the same layers")
    out: list[LayerEnergy] = []
    for name, w0 in before.items():
        w0 = w0.double()
        delta = after[name].double() - w0
        total = float(delta.pow(2).sum())
        if total == 0.0:
            raise InvalidInputError(f"layer {name} did not change: no update spectrum to measure")
        sigma2 = torch.linalg.svdvals(delta).pow(2)
        for r in ranks:
            if not 1 <= r <= min(w0.shape):
                raise InvalidInputError(f"rank {r} outside 1..{min(w0.shape)} for {name}")
            p = principal_projector(w0, r)  # [r, in]
            out.append(LayerEnergy(name, r, float((delta @ p.T).pow(2).sum()) / total, float(sigma2[:r].sum()) / total,
                                   r / w0.shape[1], total ** 0.5 / float(w0.norm())))
    return out
