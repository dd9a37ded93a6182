"""Baseline: recompute the top-k subspace (the exact SVD answer) after every row.

Optimal cost at every step (cost_t = OPT_t), recourse up to Theta(n k): whenever sigma_k and sigma_{k+1} of the
prefix swap, the subspace swaps a direction. Batched: one stack of prefix Gram matrices and one batched `eigh`
per chunk of rows.
"""

from __future__ import annotations

import torch

from rankwise.algorithms.consistent_lra.linalg import chunk_length, prefix_grams, projector_distance, tail_energy
from rankwise.algorithms.consistent_lra.stream import SubspaceStream, _Block


class RecomputeSVD(SubspaceStream):
    """The top-k right singular vectors of A^(t) at every step (promise: cost_t = OPT_t, certified)."""

    kind = "exact"
    certified = True

    def __init__(self, dim: int, rank: int) -> None:
        super().__init__(dim, rank, 0.5)  # eps is unused by the exact promise

    def _trace_eps(self) -> float:
        return 0.0

    def _process(self, rows: torch.Tensor, frob2: torch.Tensor) -> _Block:
        n, d = rows.shape
        costs, recourse, opts = [], [], []
        gram = self._gram
        for start in range(0, n, chunk_length(d)):
            x, f = rows[start:start + chunk_length(d)], frob2[start:start + chunk_length(d)]
            grams = prefix_grams(gram, x)
            values, vectors = torch.linalg.eigh(grams)
            bases = vectors[..., -self.rank:].transpose(-1, -2)  # [c, k, d]
            previous = torch.cat([self._basis[None], bases[:-1]])
            recourse.append(projector_distance(previous, bases))
            costs.append((f - values[..., -self.rank:].sum(-1)).clamp_min(0.0))
            opts.append(tail_energy(values, self.rank))
            self._basis = bases[-1].clone()
            gram = grams[-1]
        return _Block(torch.cat(costs), torch.cat(recourse), torch.ones(n, dtype=torch.bool), torch.cat(opts))
