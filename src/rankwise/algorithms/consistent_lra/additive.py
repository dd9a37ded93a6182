"""Algorithm A of the card (Thm 1.1): lazy recomputation with an additive guarantee.

Keep V and N = ||A^(tau)||_F^2 of the last recomputation tau. When ||A^(t)||_F^2 > (1 + eps) N, recompute V as the
top-k right singular vectors of A^(t) and set N = ||A^(t)||_F^2. Between recomputations

    cost_t(V) <= OPT_tau + (||A^(t)||^2 - ||A^(tau)||^2) <= OPT_t + eps ||A^(t)||_F^2,

and there are at most 1 + log_{1+eps}(||A^(n)||^2 / ||a_first nonzero||^2) recomputations, each moving the projector
by at most 2k: recourse O((k / eps) log(n d M)) for integer entries bounded by M.

A block needs one eigendecomposition per recomputation; the other rows cost a cumulative sum each.
"""

from __future__ import annotations

import math

import torch

from rankwise.algorithms.consistent_lra.linalg import captured_energy, top_k_basis
from rankwise.algorithms.consistent_lra.stream import SubspaceStream, _Block


class LazyAdditiveLRA(SubspaceStream):
    """Consistent rank-k approximation with cost_t <= OPT_t + eps ||A^(t)||_F^2 at every step (certified).

    Args: dim d, rank k (<= d), eps in (0, 1); `track_opt=True` records OPT_t per step (one eigvalsh per row).
    """

    kind = "additive"
    certified = True

    def __init__(self, dim: int, rank: int, eps: float = 0.1, *, track_opt: bool = False) -> None:
        super().__init__(dim, rank, eps, track_opt=track_opt)
        self._norm_at_recompute = 0.0  # N: ||A^(tau)||_F^2 at the last recomputation (0: none yet)
        self._first_norm = 0.0  # ||A||_F^2 at the first recomputation (the first nonzero row)

    def recomputation_bound(self) -> int:
        """1 + floor(log_{1+eps}(||A^(t)||^2 / ||A^(first recompute)||^2)): the most recomputations the rule allows."""
        if self._first_norm <= 0:
            return 0
        return 1 + math.floor(math.log(self._frob2 / self._first_norm) / math.log1p(self.eps) + 1e-9)

    def _process(self, rows: torch.Tensor, frob2: torch.Tensor) -> _Block:
        n = rows.shape[0]
        cost = torch.empty(n, dtype=torch.float64)
        step_recourse = torch.zeros(n, dtype=torch.float64)
        recomputed = torch.zeros(n, dtype=torch.bool)
        gram, pos = self._gram, 0  # gram = Gram of the stream before rows[pos]
        i = 0
        while i < n:
            over = (frob2[i:] > (1.0 + self.eps) * self._norm_at_recompute).nonzero()
            j = i + int(over[0, 0]) if over.numel() else n
            if j > i:
                gram = gram + rows[pos:i].T @ rows[pos:i]
                pos = i
                cost[i:j] = self._held_costs(self._basis, gram, rows[i:j], frob2[i:j])
            if j == n:
                break
            gram = gram + rows[pos:j + 1].T @ rows[pos:j + 1]
            pos = j + 1
            new_basis, _ = top_k_basis(gram, self.rank)
            step_recourse[j] = self._move(new_basis)
            recomputed[j] = True
            cost[j] = (frob2[j] - captured_energy(new_basis, gram)).clamp_min(0.0)
            if self._first_norm <= 0:
                self._first_norm = float(frob2[j])
            self._norm_at_recompute = float(frob2[j])
            i = j + 1
        return _Block(cost, step_recourse, recomputed)
