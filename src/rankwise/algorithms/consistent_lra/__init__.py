"""Consistent low-rank approximation (Woodruff & Zhou, ICLR 2026): a rank-k subspace over a row stream that stays
near-optimal at every step while moving as little as possible (low *recourse*).

    from rankwise.algorithms.consistent_lra import LazyAdditiveLRA, prefix_optimal_cost
    stream = LazyAdditiveLRA(dim=64, rank=10, eps=0.1)
    for block in blocks:                      # numpy or torch, [d] or [n, d]
        stream.update(block)
        V = stream.basis                      # [k, d], orthonormal rows
    stream.guarantee().holds, stream.recourse, stream.changes

Consistent algorithms: `LazyAdditiveLRA` (A, additive, certified), `RidgeLeverageLRA` (B, multiplicative w.h.p.),
`VerifiedMultiplicativeLRA` (D, multiplicative, certified). Baselines: `RecomputeSVD`, `FrequentDirectionsLRA`.
"""

from rankwise.algorithms.consistent_lra.additive import LazyAdditiveLRA
from rankwise.algorithms.consistent_lra.frequent_directions import FrequentDirectionsLRA
from rankwise.algorithms.consistent_lra.growth import growth_exponent
from rankwise.algorithms.consistent_lra.guarantee import Guarantee, StreamTrace
from rankwise.algorithms.consistent_lra.instances import adversarial_alternation, lower_bound_phases
from rankwise.algorithms.consistent_lra.leverage import RidgeLeverageLRA
from rankwise.algorithms.consistent_lra.linalg import prefix_optimal_cost, projector_distance
from rankwise.algorithms.consistent_lra.recompute import RecomputeSVD
from rankwise.algorithms.consistent_lra.stream import SubspaceStream
from rankwise.algorithms.consistent_lra.verified import VerifiedMultiplicativeLRA

__all__ = [
    "SubspaceStream", "LazyAdditiveLRA", "RidgeLeverageLRA", "VerifiedMultiplicativeLRA", "RecomputeSVD",
    "FrequentDirectionsLRA", "Guarantee", "StreamTrace", "prefix_optimal_cost", "projector_distance",
    "growth_exponent", "adversarial_alternation", "lower_bound_phases",
]
