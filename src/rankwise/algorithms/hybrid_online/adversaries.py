"""Constrained adversaries: each round's label function r_t is a member of a fixed class R, chosen from the past
and from the learner's decision h_t, never from x_t (the information timing the analysis needs).

`choose(t, decision)` gets the round index t (0-based) and the learner's decision (a Mixture) and returns r_t.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rankwise.algorithms.hybrid_online.hypotheses import Mixture, as_points, class_values
from rankwise.algorithms.hybrid_online.losses import Loss, get_loss
from rankwise.errors import InvalidInputError


def _members(members: Sequence, what: str = "the label class R") -> list:
    if len(members) == 0:
        raise InvalidInputError(f"{what} is empty: give at least one label function")
    return list(members)


class FixedAdversary:
    """r_t = r for every t (the realisable case when r is in H)."""

    def __init__(self, r):
        self.r = r

    def choose(self, t: int, decision: Mixture):
        return self.r


class AlternatingAdversary:
    """Alternates between two label functions in blocks of doubling length 1, 2, 4, ... (an FTL stress test: the
    leader is always one block late)."""

    def __init__(self, r0, r1):
        self.pair = (r0, r1)

    def choose(self, t: int, decision: Mixture):
        block = int(np.floor(np.log2(t + 1)))  # rounds 0 | 1-2 | 3-6 | 7-14 | ...
        return self.pair[block % 2]


class RandomAdversary:
    """r_t uniform over R, independently each round."""

    def __init__(self, members: Sequence, seed: int = 0):
        self.members = _members(members)
        self._rng = np.random.default_rng(seed)

    def choose(self, t: int, decision: Mixture):
        return self.members[int(self._rng.integers(len(self.members)))]


class BestResponseAdversary:
    """r_t = argmax_{r in R} of the mean loss of h_t against r on a fixed pool of samples from D (drawn apart from
    the x stream): the card's adaptive adversary. pool: [P, d]."""

    def __init__(self, members: Sequence, pool, loss: str | Loss = "absolute"):
        self.members = _members(members)
        self.pool = as_points(pool, what="pool")
        if len(self.pool) == 0:
            raise InvalidInputError("the best-response pool is empty")
        self.loss = get_loss(loss)
        self.values = class_values(self.members, self.pool)  # [|R|, P]
        self.loss.check_labels(self.values)
        self._cache: dict = {}

    def scores(self, decision: Mixture) -> np.ndarray:
        """Mean loss of the decision against each r in R on the pool, [|R|]."""
        p = decision.predict(self.pool, self._cache)
        y = self.values
        if self.loss.name == "absolute":  # |p - y| = y + p - 2py for binary y
            return (y.sum(1) + p.sum() - 2.0 * (y @ p)) / len(p)
        return ((y * y).sum(1) - 2.0 * (y @ p) + (p * p).sum()) / len(p)

    def choose(self, t: int, decision: Mixture):
        return self.members[int(np.argmax(self.scores(decision)))]
