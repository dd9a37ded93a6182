"""Algorithm D of the card: verify-then-recompute, a multiplicative guarantee by construction.

At every step compute cost_t(V) and OPT_t (float64 eigenvalues of the Gram matrix); only when
cost_t(V) > (1 + eps) OPT_t (+ rounding slack) replace V by the current top-k. Recourse is incurred only when the
promise would otherwise break. For t <= k, OPT_t = 0 and the rule keeps every row inside the subspace (a row that
leaves it forces a recomputation). No worst-case recourse bound, but the natural lazy multiplicative algorithm and
the card's empirical reference.

Batched: per chunk of rows one stack of prefix Gram matrices and one batched `eigvalsh`; the costs of holding V are
cumulative sums, re-evaluated from each recomputation on.
"""

from __future__ import annotations

import torch

from rankwise.algorithms.consistent_lra.linalg import (
    captured_energy, chunk_length, prefix_grams, rounding_slack, tail_energy, top_k_basis,
)
from rankwise.algorithms.consistent_lra.stream import SubspaceStream, _Block


class VerifiedMultiplicativeLRA(SubspaceStream):
    """Consistent rank-k approximation with cost_t <= (1 + eps) OPT_t at every step (certified, exact OPT_t)."""

    kind = "multiplicative"
    certified = True

    def __init__(self, dim: int, rank: int, eps: float = 0.1) -> None:
        super().__init__(dim, rank, eps)

    def _process(self, rows: torch.Tensor, frob2: torch.Tensor) -> _Block:
        n, d = rows.shape
        cost = torch.empty(n, dtype=torch.float64)
        step_recourse = torch.zeros(n, dtype=torch.float64)
        recomputed = torch.zeros(n, dtype=torch.bool)
        opt = torch.empty(n, dtype=torch.float64)
        steps = self._t + 1 + torch.arange(n)
        gram = self._gram
        for start in range(0, n, chunk_length(d)):
            stop = min(n, start + chunk_length(d))
            x, f = rows[start:stop], frob2[start:stop]
            grams = prefix_grams(gram, x)
            o = tail_energy(torch.linalg.eigvalsh(grams), self.rank)
            opt[start:stop] = o
            allowed = (1.0 + self.eps) * o + rounding_slack(f, d, steps[start:stop])
            i = 0
            while i < x.shape[0]:
                before = gram if i == 0 else grams[i - 1]
                held = self._held_costs(self._basis, before, x[i:], f[i:])
                bad = (held > allowed[i:]).nonzero()
                j = i + int(bad[0, 0]) if bad.numel() else x.shape[0]
                cost[start + i:start + j] = held[:j - i]
                if j == x.shape[0]:
                    break
                new_basis, _ = top_k_basis(grams[j], self.rank)
                step_recourse[start + j] = self._move(new_basis)
                recomputed[start + j] = True
                cost[start + j] = (f[j] - captured_energy(new_basis, grams[j])).clamp_min(0.0)
                i = j + 1
            gram = grams[-1]
        return _Block(cost, step_recourse, recomputed, opt)
