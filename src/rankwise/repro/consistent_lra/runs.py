"""One run of every algorithm on one stream: the per-step record reduced to what the report needs."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from rankwise.algorithms.consistent_lra import (
    FrequentDirectionsLRA, LazyAdditiveLRA, RecomputeSVD, RidgeLeverageLRA, SubspaceStream, VerifiedMultiplicativeLRA,
    growth_exponent, prefix_optimal_cost,
)

A, B, D, SVD, FD = "A: lazy additive", "B: ridge-leverage sampling", "D: verify-then-recompute", "recompute SVD", \
    "Frequent Directions"
# B again at a small oversampling constant: at the card's c (0.5-4) the real streams are shorter than the sample the
# theorem needs (~ k log n / eps^2 rows), so p_t = 1 at nearly every step and B *is* recompute-the-SVD there.
B_SPARSE = "B': ridge-leverage sampling, small c"
SAMPLERS = (B, B_SPARSE)
CONSISTENT = (A, B, B_SPARSE, D)
BASELINES = (SVD, FD)
ALGORITHMS = (A, B, B_SPARSE, D, SVD, FD)
BLOCK = 500  # rows per update() call: the streams are fed in blocks, as a user would


def make_stream(name: str, dim: int, rank: int, eps: float, oversampling: tuple[float, float],
                seed: int) -> SubspaceStream:
    """`oversampling`: B's c and B''s (small) c."""
    makers: dict[str, Callable[[], SubspaceStream]] = {
        A: lambda: LazyAdditiveLRA(dim, rank, eps),
        B: lambda: RidgeLeverageLRA(dim, rank, eps, oversampling=oversampling[0], seed=seed),
        B_SPARSE: lambda: RidgeLeverageLRA(dim, rank, eps, oversampling=oversampling[1], seed=seed),
        D: lambda: VerifiedMultiplicativeLRA(dim, rank, eps),
        SVD: lambda: RecomputeSVD(dim, rank),
        FD: lambda: FrequentDirectionsLRA(dim, rank, eps),
    }
    return makers[name]()


@dataclass
class Run:
    algorithm: str
    stream: str
    seed: int
    recourse: np.ndarray  # cumulative, per step
    path_length: float
    changes: np.ndarray  # cumulative, per step
    recomputations: int
    worst_violation: float  # max_t (cost - bound) / F_t: <= 0 where the promise held at every step
    worst_multiplicative_violation: float  # the same against (1 + eps) OPT_t, whatever the algorithm promises
    worst_ratio: float  # max_t cost / OPT over steps with OPT > 0
    worst_additive: float  # max_t (cost - OPT) / F_t
    promise_eps: float
    ratio_curve: np.ndarray
    additive_curve: np.ndarray
    seconds: float
    log_bound: int | None = None  # A only: 1 + log_{1+eps}(F_n / F_first)

    @property
    def total_recourse(self) -> float:
        return float(self.recourse[-1])

    @property
    def total_changes(self) -> int:
        return int(self.changes[-1])

    @property
    def exponent(self) -> float:
        return growth_exponent(self.recourse)

    @property
    def changes_exponent(self) -> float:
        return growth_exponent(self.changes.astype(np.float64))

    @property
    def changed_fraction(self) -> float:
        """Share of the steps at which the subspace moved (for B: the share of rows it sampled)."""
        return self.total_changes / len(self.changes)


def run_all(rows: np.ndarray, stream: str, rank: int, eps: float, oversampling: tuple[float, float], seed: int,
            algorithms: tuple[str, ...] = ALGORITHMS, opt: torch.Tensor | None = None) -> dict[str, Run]:
    """Feed `rows` [n, d] to every algorithm (in blocks of BLOCK rows) and check each against the exact OPT_t.
    `oversampling`: the c of B and of B'. `opt`: OPT_t [n] of these rows at this rank, if already computed."""
    x = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float64))
    opt = prefix_optimal_cost(x, rank) if opt is None else opt
    out = {}
    for name in algorithms:
        s = make_stream(name, x.shape[1], rank, eps, oversampling, seed)
        t0 = time.perf_counter()
        for start in range(0, x.shape[0], BLOCK):
            s.update(x[start:start + BLOCK])
        seconds = time.perf_counter() - t0
        tr = s.trace
        ratio = tr.ratio(opt)
        finite = ratio[torch.isfinite(ratio) & (opt > 0)]
        out[name] = Run(
            algorithm=name, stream=stream, seed=seed, recourse=tr.recourse.numpy(),
            path_length=float(tr.path_length[-1]), changes=tr.changes.numpy(), recomputations=s.recomputations,
            worst_violation=float(tr.violation(opt).max()),
            worst_multiplicative_violation=float(tr.violation(opt, "multiplicative").max()),
            worst_ratio=float(finite.max()) if finite.numel() else 1.0,
            worst_additive=float(tr.additive_error(opt).max()), promise_eps=tr.eps,
            ratio_curve=ratio.numpy(), additive_curve=tr.additive_error(opt).numpy(), seconds=seconds,
            log_bound=s.recomputation_bound() if isinstance(s, LazyAdditiveLRA) else None)
    return out


def mean(values) -> float:
    v = [float(x) for x in values]
    return sum(v) / len(v) if v else math.nan


def std(values) -> float:
    v = [float(x) for x in values]
    if len(v) < 2:
        return 0.0
    m = mean(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))
