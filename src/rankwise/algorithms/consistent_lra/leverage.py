"""Algorithm B of the card (Thm 1.3, simple version; the card's reconstruction): online ridge-leverage sampling,
recompute on sample.

A reweighted sample S of the rows is kept (as its Gram matrix S^T S). Row a_t has online ridge leverage score

    tau_t = min(1, a_t (S^T S + lambda I)^-1 a_t^T),   lambda = ||S - [S]_k||_F^2 / k,

and is kept with probability p_t = min(1, c tau_t log(t + 1) / eps^2), stored as a_t / sqrt(p_t). V is recomputed as
the top-k of S only when a row is sampled, so recourse <= 2k x (number of samples), and S is a projection-cost
preserving sketch, so V stays (1 + O(eps))-optimal with high probability (not certified: the trace records it).

The coin of step t is a counter-based hash of (seed, t), so the output does not depend on how rows are split into
blocks. Between samples the sketch is fixed: the scores of a chunk of rows come from one eigendecomposition.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from rankwise.algorithms.consistent_lra.linalg import EPS64, captured_energy, chunk_length, tail_energy
from rankwise.algorithms.consistent_lra.stream import SubspaceStream, _Block
from rankwise.errors import InvalidInputError

_GOLDEN, _M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = z + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def step_uniforms(seed: int, steps: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) numbers, one per step number, from a hash of (seed, step): the same for any block split."""
    key = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    z = _splitmix64(np.asarray(steps, dtype=np.uint64) ^ key)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


class RidgeLeverageLRA(SubspaceStream):
    """Consistent rank-k approximation by online ridge-leverage sampling (promise (1 + eps) OPT_t w.h.p.).

    Args: dim d, rank k, eps in (0, 1), `oversampling` c (the card: a tuning constant, 0.5-4), `seed`.
    """

    kind = "multiplicative"
    certified = False

    def __init__(self, dim: int, rank: int, eps: float = 0.1, *, oversampling: float = 1.0, seed: int = 0,
                 track_opt: bool = False) -> None:
        super().__init__(dim, rank, eps, track_opt=track_opt)
        if isinstance(oversampling, bool) or not isinstance(oversampling, (int, float)) or not (
                math.isfinite(oversampling) and oversampling > 0):
            raise InvalidInputError(f"oversampling must be a positive number, got {oversampling!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise InvalidInputError(f"seed must be an integer, got {seed!r}")
        self.oversampling, self.seed = float(oversampling), int(seed)
        self._sample_gram = torch.zeros(dim, dim, dtype=torch.float64)  # S^T S
        self._sample_eig: tuple[torch.Tensor, torch.Tensor] | None = None  # eigh(S^T S), None while S is empty
        self.samples = 0

    def scores(self, rows: torch.Tensor) -> torch.Tensor:
        """Online ridge leverage scores tau [n] of `rows` [n, d] against the current sample (1 while S is empty)."""
        if self._sample_eig is None:
            return torch.ones(rows.shape[0], dtype=torch.float64)
        values, vectors = self._sample_eig
        values = values.clamp_min(0)
        ridge = float(tail_energy(values, self.rank)) / self.rank
        floor = 8.0 * values.numel() * EPS64 * float(values[-1])  # keeps a rank-deficient S^T S invertible
        tau = ((rows @ vectors).pow(2) / (values + ridge + floor)).sum(1)
        return tau.clamp(max=1.0)

    def _process(self, rows: torch.Tensor, frob2: torch.Tensor) -> _Block:
        n, d = rows.shape
        cost = torch.empty(n, dtype=torch.float64)
        step_recourse = torch.zeros(n, dtype=torch.float64)
        recomputed = torch.zeros(n, dtype=torch.bool)
        steps = self._t + 1 + np.arange(n)
        coins = torch.from_numpy(step_uniforms(self.seed, steps))
        log_t = torch.log1p(torch.from_numpy(steps.astype(np.float64)))
        gram, i = self._gram, 0  # gram: the stream's Gram before rows[i]
        while i < n:
            j_end = min(n, i + chunk_length(d))
            x = rows[i:j_end]
            p = (self.oversampling * self.scores(x) * log_t[i:j_end] / self.eps**2).clamp(max=1.0)
            p = torch.where((x * x).sum(1) > 0, p, torch.zeros_like(p))  # a zero row carries nothing to keep
            hit = (coins[i:j_end] < p).nonzero()
            j = i + int(hit[0, 0]) if hit.numel() else j_end
            cost[i:j] = self._held_costs(self._basis, gram, rows[i:j], frob2[i:j])
            gram = gram + rows[i:j].T @ rows[i:j]
            if not hit.numel():
                i = j_end
                continue
            a, pj = rows[j], float(p[j - i])
            self._sample_gram = self._sample_gram + torch.outer(a, a) / pj
            self._sample_eig = torch.linalg.eigh(self._sample_gram)
            self.samples += 1
            new_basis = self._sample_eig[1][:, -self.rank:].T.contiguous()
            gram = gram + torch.outer(a, a)
            step_recourse[j] = self._move(new_basis)
            recomputed[j] = True
            cost[j] = (frob2[j] - captured_energy(new_basis, gram)).clamp_min(0.0)
            i = j + 1
        return _Block(cost, step_recourse, recomputed)
