"""Held-out test configurations: random per-layer mixes at a ladder of average-bit targets.

Each starts from uniformly random knobs on every layer; then random layers are moved one step cheaper or costlier
(weight bits first, then the block size) until the average lies within `tol` of the target. Drawn from the
experiment's own seed stream, never from the training sampler's, and checked against what training saw.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rankwise.errors import InvalidInputError
from rankwise.recipes.coa_lora import ConfigSpace
from rankwise.recipes.coa_lora.space import Configuration


def config_near(space: ConfigSpace, target: float, rng: np.random.Generator, tol: float = 0.1, max_moves: int = 10_000) -> Configuration:
    vec = np.array(space.to_vector(space.random(rng)))
    cards = space.cardinalities
    for _ in range(max_moves):
        bits = space.average_bits(space.from_vector(vec))
        if abs(bits - target) <= tol:
            return space.from_vector(vec)
        cheaper = bits > target
        layer = int(rng.integers(space.n_layers))
        # knob 0 (weight bits): lower index = cheaper; knob 3 (block size): higher index = larger block = cheaper
        knob = 0 if rng.random() < 0.7 else 3
        j = layer * 5 + knob
        step = (-1 if cheaper else 1) if knob == 0 else (1 if cheaper else -1)
        if 0 <= vec[j] + step < cards[j]:
            vec[j] += step
    raise InvalidInputError(f"no configuration within {tol} of {target} average bits found")


def held_out_configs(space: ConfigSpace, targets: Sequence[float], seed: int) -> list[Configuration]:
    rng = np.random.default_rng(seed)
    return [config_near(space, float(t), rng) for t in targets]
