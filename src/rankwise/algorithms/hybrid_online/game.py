"""The zero-sum-game corollary: min_{h in conv(H)} max_{r in R} E_D l(h(x), r(x)), solved by running the hybrid
learner against a best-responding adversary, and checked against the linear programme of the matrix game.

For a {0,1}-valued R and the absolute loss, l(h(x), r(x)) is linear in the mixture h, so on a finite support of D
(atoms with probabilities) the game is the matrix game M[i, j] = E_D |h_i - r_j| over pure members, and its value
and equilibria come from `scipy.optimize.linprog` (`matrix_game`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rankwise.algorithms.hybrid_online.hypotheses import as_points, class_values
from rankwise.algorithms.hybrid_online.learners import EmpiricalLearner
from rankwise.algorithms.hybrid_online.losses import Loss, get_loss
from rankwise.errors import InvalidInputError, NumericalError


@dataclass(frozen=True)
class GameSolution:
    value: float  # the row player's (minimiser's) LP value
    dual_value: float  # the column player's LP value (= value at an exact solution)
    row: np.ndarray  # [n_rows] the minimiser's equilibrium mixture
    col: np.ndarray  # [n_cols] the maximiser's equilibrium mixture


def matrix_game(M) -> GameSolution:
    """Value and equilibrium of the zero-sum game with loss matrix M [n_rows, n_cols] (rows minimise), by two
    linear programmes (HiGHS): min_w max_j (w^T M)_j and max_q min_i (M q)_i."""
    from scipy.optimize import linprog

    M = np.asarray(M, dtype=np.float64)
    if M.ndim != 2 or M.size == 0:
        raise InvalidInputError(f"M must be a non-empty [n_rows, n_cols] matrix, got shape {M.shape}")
    if not np.all(np.isfinite(M)):
        raise InvalidInputError("M has NaN or Inf entries")
    n, k = M.shape
    # rows: variables (w [n], v); minimise v s.t. M^T w - v <= 0, sum w = 1
    c = np.r_[np.zeros(n), 1.0]
    primal = linprog(c, A_ub=np.c_[M.T, -np.ones(k)], b_ub=np.zeros(k), A_eq=np.r_[np.ones(n), 0.0][None],
                     b_eq=[1.0], bounds=[(0, None)] * n + [(None, None)], method="highs")
    # columns: variables (q [k], u); maximise u s.t. u - M q <= 0, sum q = 1
    dual = linprog(-np.r_[np.zeros(k), 1.0], A_ub=np.c_[-M, np.ones(n)], b_ub=np.zeros(n),
                   A_eq=np.r_[np.ones(k), 0.0][None], b_eq=[1.0], bounds=[(0, None)] * k + [(None, None)],
                   method="highs")
    if primal.status != 0 or dual.status != 0:
        raise NumericalError(f"linprog did not solve the matrix game: {primal.message} / {dual.message}")
    w, q = np.clip(primal.x[:n], 0, None), np.clip(dual.x[:k], 0, None)
    return GameSolution(float(primal.x[-1]), float(dual.x[-1]), w / w.sum(), q / q.sum())


def payoff_matrix(H: Sequence, R: Sequence, atoms, probs, loss: str | Loss = "absolute") -> np.ndarray:
    """M[i, j] = sum_k probs[k] l(H[i](atoms[k]), R[j](atoms[k])), [|H|, |R|]."""
    if len(H) == 0 or len(R) == 0:
        raise InvalidInputError("both classes of the game must be non-empty")
    x = as_points(atoms, what="atoms")
    p = _probs(probs, len(x))
    lo = get_loss(loss)
    hv, rv = class_values(list(H), x), class_values(list(R), x)
    return np.stack([(lo.value(hv, np.broadcast_to(rv[j], hv.shape)) * p).sum(1) for j in range(len(R))], axis=1)


def _probs(probs, k: int) -> np.ndarray:
    p = np.asarray(probs, dtype=np.float64)
    if p.shape != (k,) or np.any(p < 0) or not np.isfinite(p).all() or abs(p.sum() - 1) > 1e-9:
        raise InvalidInputError(f"probs must be [{k}] non-negative numbers summing to 1, got shape {p.shape}")
    return p


@dataclass(frozen=True)
class LearnedGame:
    row_values: np.ndarray  # [k] the averaged learner strategy h_bar on the atoms
    col_mix: np.ndarray  # [|R|] frequency of each r in R among r_1..r_m
    exploitability_row: float  # max_r E_D l(h_bar, r) - V*  (>= 0)
    exploitability_col: float  # V* - min_h E_D l(h, r_bar)  (>= 0)
    value_estimate: float  # E_D l(h_bar, r_bar)
    calls: int  # oracle calls of the learner

    @property
    def duality_gap(self) -> float:
        return self.exploitability_row + self.exploitability_col


def learn_game(make_learner: Callable[[int], EmpiricalLearner], H: Sequence, R: Sequence, atoms, probs, m: int,
               rng: np.random.Generator, solution: GameSolution | None = None) -> LearnedGame:
    """The corollary with m samples: x_t ~ D for t <= m; r_t = the best response (in R) to h_t on x_1..x_{t-1}
    (not on x_t, which keeps the hybrid timing); the averages h_bar = mean_t h_t and r_bar = mean_t r_t are the
    approximate saddle point, scored on D exactly. make_learner(m) -> a learner whose oracle ranges over H."""
    if not isinstance(m, int) or m < 2:
        raise InvalidInputError(f"m must be an int >= 2, got {m!r}")
    x = as_points(atoms, what="atoms")
    p = _probs(probs, len(x))
    R = list(R)
    M = payoff_matrix(H, R, x, p)
    sol = solution or matrix_game(M)
    r_atoms = class_values(R, x)  # [|R|, k]
    get_loss("absolute").check_labels(r_atoms)
    learner = make_learner(m)
    idx = rng.choice(len(x), size=m, p=p)
    hbar = np.zeros(len(x))
    counts = np.zeros(len(R))
    for t in range(m):
        h = learner.decide()
        if t == 0:
            j = 0
        else:  # argmax_r sum_{i<t} |h_t(x_i) - r(x_i)| = sum y + sum p - 2 y.p, y binary
            pv = h.predict(x[idx[:t]])
            yv = r_atoms[:, idx[:t]]
            j = int(np.argmax(yv.sum(1) - 2.0 * (yv @ pv)))
        hbar += h.predict(x)
        counts[j] += 1
        learner.observe(x[idx[t]], R[j])
    hbar /= m
    q = counts / m
    row_payoff = ((np.abs(hbar[None] - r_atoms)) * p).sum(1)  # [|R|] E_D |h_bar - r_j|
    return LearnedGame(hbar, q, float(row_payoff.max() - sol.value), float(sol.value - (M @ q).min()),
                       float(row_payoff @ q), int(sum(learner.calls)))
