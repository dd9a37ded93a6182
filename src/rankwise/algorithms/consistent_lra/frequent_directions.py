"""Baseline: Frequent Directions (Liberty 2013; Ghashami, Liberty, Phillips, Woodruff 2016), top-k at every step.

The sketch B holds at most 2l rows; when it is full it is shrunk: with B^T B = V diag(lambda) V^T and
delta = lambda_l (the l-th largest), B^T B <- V diag(max(lambda - delta, 0)) V^T, which leaves l - 1 rows. The
output at every step is the top-k right singular vectors of the current sketch, and

    ||A - A V_k^T V_k||_F^2 <= (1 + k / (l - k)) OPT_t        (Ghashami et al. 2016, Thm 3.1),

so l = k + ceil(k / eps) gives the multiplicative promise with eps. The sketch is kept as its Gram matrix B^T B
[d, d] (the same top-k subspace and shrink as the row form; O(d^2) memory like the other streams). FD recomputes
its output after every row, so sigma_k / sigma_{k+1} swaps in the sketch move it: recourse can grow like n.
"""

from __future__ import annotations

import math

import torch

from rankwise.algorithms.consistent_lra.linalg import captured_energy, chunk_length, prefix_grams, projector_distance
from rankwise.algorithms.consistent_lra.stream import SubspaceStream, _Block
from rankwise.errors import InvalidInputError


class FrequentDirectionsLRA(SubspaceStream):
    """Frequent Directions with sketch size l (default k + ceil(k / eps)); promise cost_t <= (1 + k/(l-k)) OPT_t."""

    kind = "multiplicative"
    certified = True

    def __init__(self, dim: int, rank: int, eps: float = 0.1, *, sketch_rows: int | None = None,
                 track_opt: bool = False) -> None:
        super().__init__(dim, rank, eps, track_opt=track_opt)
        ell = rank + math.ceil(rank / eps) if sketch_rows is None else sketch_rows
        if isinstance(ell, bool) or not isinstance(ell, int) or ell <= rank:
            raise InvalidInputError(f"sketch_rows must be an integer > rank={rank}, got {sketch_rows!r}")
        self.sketch_rows = ell
        self._sketch = torch.zeros(dim, dim, dtype=torch.float64)  # B^T B
        self._rows_in_sketch = 0
        self.shrinks = 0

    def _trace_eps(self) -> float:
        return self.rank / (self.sketch_rows - self.rank)

    def _shrink(self) -> None:
        values, vectors = torch.linalg.eigh(self._sketch)
        d = values.numel()
        delta = values[d - self.sketch_rows].clamp_min(0) if self.sketch_rows <= d else values.new_zeros(())
        self._sketch = (vectors * (values - delta).clamp_min(0)) @ vectors.T
        self._rows_in_sketch = self.sketch_rows - 1
        self.shrinks += 1

    def _process(self, rows: torch.Tensor, frob2: torch.Tensor) -> _Block:
        n, d = rows.shape
        costs, recourse = [], []
        gram = self._gram
        i = 0
        while i < n:
            # rows until the sketch is full (2l rows) or the chunk ends, then shrink if full
            room = 2 * self.sketch_rows - self._rows_in_sketch
            j = min(n, i + room, i + chunk_length(d))
            x, f = rows[i:j], frob2[i:j]
            sketches = prefix_grams(self._sketch, x)
            bases = torch.linalg.eigh(sketches)[1][..., -self.rank:].transpose(-1, -2)
            grams = prefix_grams(gram, x)
            previous = torch.cat([self._basis[None], bases[:-1]])
            recourse.append(projector_distance(previous, bases))
            costs.append((f - captured_energy(bases, grams)).clamp_min(0.0))
            self._basis = bases[-1].clone()
            self._sketch, gram = sketches[-1], grams[-1]
            self._rows_in_sketch += j - i
            if self._rows_in_sketch >= 2 * self.sketch_rows:
                self._shrink()
            i = j
        return _Block(torch.cat(costs), torch.cat(recourse), torch.ones(n, dtype=torch.bool))
