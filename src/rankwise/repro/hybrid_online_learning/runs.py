"""The regret experiments' building blocks: problem cells (D, H, R, adversary), the three learners, one run each.

Experiment A (the card's CPU reproduction): X = [0, 1], D = Beta(2, 5), H = 201 thresholds 1{x >= theta} (exact
oracle by prefix sums), absolute loss. Experiment B (real features): D = uniform over the 569 rows of scikit-learn's
breast-cancer data (30 standardised features), H = all decision stumps on them, R = stumps on 5 quantiles per
feature (R in H), adversary = best response on the whole data set (exact under D).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from rankwise.algorithms.hybrid_online import (
    AlternatingAdversary, BestResponseAdversary, FixedAdversary, FollowPerturbedLeader, FollowTheLeader, HybridFTRL,
    RandomAdversary, SklearnERMOracle, Stump, StumpOracle, interval_class, play, regret, threshold_class,
)

FTRL, FTL, FTPL, FTRL_SK = "ftrl", "ftl", "ftpl", "ftrl-sklearn"
GRID = np.linspace(0.0, 1.0, 201)
INTERVAL_GRID = np.linspace(0.0, 1.0, 41)
POOL = 1000
UNIT_TOL = 1e-12  # a mixture's weights sum to 1 up to rounding, so its value may leave [0, 1] by an ulp or so  # samples of D behind the adaptive adversary's best response


@dataclass(frozen=True)
class Cell:
    """One adversary on one label class. `adversary(seed)` builds a fresh adversary for a run."""

    name: str
    adversary: Callable[[int], object]
    draw: Callable[[np.random.Generator], np.ndarray]
    oracle: object  # exact oracle over H (the learners' oracle and the regret comparator's)


def beta_draw(g: np.random.Generator) -> np.ndarray:
    return g.beta(2.0, 5.0, 1)


def threshold_cells() -> dict[str, Cell]:
    H = threshold_class(GRID)
    oracle = StumpOracle([GRID], signs=(1,))
    R_int = interval_class(INTERVAL_GRID)

    def pool(seed: int) -> np.ndarray:
        return np.random.default_rng(seed + 7_000_000).beta(2.0, 5.0, POOL)[:, None]

    lo, hi = H[30], H[80]  # theta = 0.15 and 0.40: both carry mass under Beta(2, 5)
    return {
        "thresholds/best-response": Cell("thresholds/best-response", lambda s: BestResponseAdversary(H, pool(s)),
                                         beta_draw, oracle),
        "intervals/best-response": Cell("intervals/best-response", lambda s: BestResponseAdversary(R_int, pool(s)),
                                        beta_draw, oracle),
        "thresholds/alternating": Cell("thresholds/alternating", lambda s: AlternatingAdversary(lo, hi), beta_draw,
                                       oracle),
        "thresholds/iid": Cell("thresholds/iid", lambda s: RandomAdversary(H, seed=s + 5_000_000), beta_draw, oracle),
        "thresholds/fixed": Cell("thresholds/fixed", lambda s: FixedAdversary(H[60]), beta_draw, oracle),
    }


def breast_cancer_cell() -> tuple[Cell, np.ndarray]:
    """Experiment B's cell and the data matrix [569, 30] (standardised)."""
    from sklearn.datasets import load_breast_cancer

    X = load_breast_cancer().data.astype(np.float64)
    X = (X - X.mean(0)) / X.std(0)
    # H: every stump with a threshold at a data value (plus +inf for the constants): all behaviours on D's support.
    grids = [np.r_[np.unique(X[:, f]), np.inf] for f in range(X.shape[1])]
    oracle = StumpOracle(grids, signs=(1, -1))
    qs = np.quantile(X, [0.1, 0.3, 0.5, 0.7, 0.9], axis=0)  # [5, d]
    R = [Stump(f, float(qs[k, f]), s) for f in range(X.shape[1]) for k in range(5) for s in (1, -1)]

    def draw(g: np.random.Generator) -> np.ndarray:
        return X[int(g.integers(len(X)))]

    return Cell("breast-cancer/best-response", lambda s: BestResponseAdversary(R, X), draw, oracle), X


def make_learner(arm: str, cell: Cell, horizon: int, seed: int, eta_scale: float = 1.0, ftpl_scale: float = 1.0,
                 budget: int = 32):
    """A fresh learner; `budget` = oracle calls per round at most (Frank-Wolfe iterations / perturbed leaders)."""
    if arm == FTRL:
        return HybridFTRL(cell.oracle, "absolute", horizon, eta_scale=eta_scale, max_iter=budget)
    if arm == FTRL_SK:
        return HybridFTRL(SklearnERMOracle(dim=cell.oracle.dim), "absolute", horizon, eta_scale=eta_scale,
                          max_iter=budget)
    if arm == FTL:
        return FollowTheLeader(cell.oracle, "absolute", horizon, max_iter=budget)
    if arm == FTPL:
        return FollowPerturbedLeader(cell.oracle, "absolute", horizon, scale=ftpl_scale, samples=budget,
                                     seed=seed + 3_000_000)
    raise ValueError(arm)


@dataclass(frozen=True)
class RunResult:
    regret: float
    learner_loss: float
    mean_calls: float
    max_calls: int
    seconds: float
    predictions_in_unit: bool


def run_one(arm: str, cell: Cell, horizon: int, seed: int, **kw) -> RunResult:
    """One game of `horizon` rounds; the x stream and the adversary depend on `seed` only (not on the arm), so the
    arms of a seed face the same draws."""
    learner = make_learner(arm, cell, horizon, seed, **kw)
    run = play(learner, cell.adversary(seed), cell.draw, horizon, np.random.default_rng(seed))
    p = run.predictions
    return RunResult(regret(run, cell.oracle), run.learner_loss, float(run.calls.mean()), int(run.calls.max()),
                     run.seconds, bool(np.all((p >= -UNIT_TOL) & (p <= 1 + UNIT_TOL))))
