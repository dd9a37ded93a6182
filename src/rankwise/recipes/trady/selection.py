"""Which units a sub-network updates, under a memory budget: TraDy's uniform draw (Algorithm 1), the deterministic
top-RGN choice (the S-/D-Det RGN baselines) and Velocity's top-velocity neurons.

The pool is one flat list of units (layer, unit) over the layers a selection may use; `UnitPool` maps between that
list and per-layer index tensors and holds each unit's cost. Every rule fills the budget with `costs.fill_budget`:
units in the rule's order until the next one would exceed the budget.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from rankwise.recipes.trady.costs import INPUT, LayerGeometry, fill_budget


@dataclass(frozen=True)
class UnitPool:
    """Units of `layers` (in this order) along `axis`; `layer_of[i]`, `unit_of[i]` and `cost[i]` (int64) per unit."""

    layers: tuple[str, ...]
    axis: int
    layer_of: torch.Tensor
    unit_of: torch.Tensor
    cost: torch.Tensor

    @classmethod
    def build(cls, geometries: Mapping[str, LayerGeometry], layers: Sequence[str], axis: int = INPUT,
              weights_only: bool = False) -> UnitPool:
        """`weights_only`: a unit costs its weight derivative only (Velocity's own accounting)."""
        layer_of, unit_of, cost = [], [], []
        for i, name in enumerate(layers):
            g = geometries[name]
            n = g.units(axis)
            per_unit = g.weight_cost(axis) + (0 if weights_only or axis != INPUT else g.activation_cost(axis))
            layer_of.append(torch.full((n,), i, dtype=torch.long))
            unit_of.append(torch.arange(n))
            cost.append(torch.full((n,), per_unit, dtype=torch.long))
        return cls(tuple(layers), axis, torch.cat(layer_of), torch.cat(unit_of), torch.cat(cost))

    def __len__(self) -> int:
        return int(self.cost.numel())

    def split(self, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per layer, the (ascending) unit indices among `positions`; every layer of the pool has an entry."""
        out = {}
        for i, name in enumerate(self.layers):
            out[name] = self.unit_of[positions[self.layer_of[positions] == i]].sort().values
        return out

    def flat(self, scores: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-unit scores (one tensor [units] per layer) as one flat tensor in pool order."""
        return torch.cat([scores[name].double() for name in self.layers])


def draw_key(seed: int, epoch: int) -> int:
    """The generator seed of epoch `epoch`'s draw: a pure function of (seed, epoch), the same on every machine."""
    digest = hashlib.sha256(f"trady:{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def random_selection(pool: UnitPool, budget: int, seed: int, epoch: int) -> torch.Tensor:
    """Algorithm 1: units drawn uniformly without replacement, added until the next draw would exceed `budget`."""
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(draw_key(seed, epoch)))
    return fill_budget(order, pool.cost, budget)


def top_score_selection(pool: UnitPool, scores: torch.Tensor, budget: int) -> torch.Tensor:
    """Units by descending score (ties by pool order), added until the next one would exceed `budget`."""
    order = torch.sort(-scores.double(), stable=True).indices
    return fill_budget(order, pool.cost, budget)
