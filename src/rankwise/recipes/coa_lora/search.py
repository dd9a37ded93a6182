"""CoA-LoRA's configuration set: an ILP-seeded pool, refined by Pareto-driven search once per period.

State: an archive of evaluated configurations (vector, average bits, loss) and the current training set C from which
each micro-batch draws its configuration. `update(evaluate, step)`:
  1. evaluates archived configurations that have no loss yet (at the first update: the initial pool);
  2. proposes new configurations (two GPs + qLogEHVI + integer hill-climbing, `algorithms.config_search`),
     evaluates them and adds them to the archive;
  3. replaces C by the segmented Pareto filter of the archive (per window of average bits, the non-dominated set).
`evaluate(config) -> loss` is the task loss on one training batch with the current adapter (the caller's).
Randomness is a pure function of (seed, step).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from rankwise.algorithms.config_search import allocation_ladder, propose_configurations, segmented_pareto
from rankwise.errors import InvalidInputError
from rankwise.recipes.coa_lora.space import ConfigSpace, Configuration


def stream_seed(*parts: int | str) -> int:
    """A 63-bit seed from (seed, step, micro, ...): the same parts always give the same stream."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def ilp_pool(space: ConfigSpace, errors: np.ndarray, budgets: Sequence[float]) -> list[Configuration]:
    """LQ-LoRA-style allocations (least total quantization error per budget), distinct, in budget order."""
    allocations = allocation_ladder(errors, space.option_bits, space.sizes, budgets)
    if not allocations:
        raise InvalidInputError(f"no configuration of this space fits any budget in [{min(budgets)}, {max(budgets)}] bits")
    return [space.from_option_indices(a) for a in allocations]


@dataclass
class Archive:
    vectors: list[list[int]] = field(default_factory=list)
    bits: list[float] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)
    added_at: list[int] = field(default_factory=list)  # step (-1: the initial pool)


class ConfigurationSearch:
    """The archive and the training set C (see the module docstring)."""

    def __init__(self, space: ConfigSpace, pool: Sequence[Configuration], seed: int, n_starts: int = 5,
                 bins: tuple[float, float, float] = (2.25, 6.5, 0.25), max_steps: int | None = None) -> None:
        if not pool:
            raise InvalidInputError("the initial configuration pool is empty")
        self.space, self.seed, self.n_starts, self.bins, self.max_steps = space, seed, n_starts, bins, max_steps
        self.archive = Archive()
        for config in pool:
            self._add(config, -1)
        self.training_set: list[Configuration] = [space.check(c) for c in pool]
        self.history: list[dict] = []

    def _add(self, config: Configuration, step: int, loss: float | None = None) -> None:
        self.archive.vectors.append(self.space.to_vector(config))
        self.archive.bits.append(self.space.average_bits(config))
        self.archive.losses.append(loss)
        self.archive.added_at.append(step)

    def update(self, evaluate: Callable[[Configuration], float], step: int) -> dict:
        a, space = self.archive, self.space
        for i, loss in enumerate(a.losses):
            if loss is None:
                a.losses[i] = float(evaluate(space.from_vector(a.vectors[i])))
        proposal = propose_configurations(a.vectors, space.cardinalities, a.bits, a.losses, n_starts=self.n_starts,
                                          max_steps=self.max_steps, seed=stream_seed(self.seed, "search", step) % 2**31)
        for vector in proposal.candidates.tolist():
            config = space.from_vector(vector)
            self._add(config, step, float(evaluate(config)))
        keep = segmented_pareto(a.bits, a.losses, *self.bins)
        if keep:  # an empty filter (every point outside the bins) keeps the previous set
            self.training_set = [space.from_vector(a.vectors[i]) for i in keep]
        record = {"step": step, "archive": len(a.vectors), "new": len(proposal.candidates), "training_set": len(self.training_set),
                  "bits_range": [min(a.bits[i] for i in keep), max(a.bits[i] for i in keep)] if keep else None}
        self.history.append(record)
        return record

    def best_within(self, budget: float) -> Configuration | None:
        """The evaluated configuration of lowest loss among those within `budget` average bits."""
        a = self.archive
        ok = [i for i in range(len(a.vectors)) if a.bits[i] <= budget + 1e-12 and a.losses[i] is not None]
        if not ok:
            return None
        return self.space.from_vector(a.vectors[min(ok, key=lambda i: (a.losses[i], a.bits[i]))])
