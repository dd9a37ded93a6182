"""The zero-sum-game corollary on a small game: thresholds (21) against intervals (66) under a discretised
Beta(2, 5), u = |h - r|; the learner's averaged strategy against the linprog equilibrium."""

from __future__ import annotations

import math

import numpy as np

from rankwise.algorithms.hybrid_online import (
    FiniteClassOracle, FollowTheLeader, HybridFTRL, class_values, empirical_rademacher, interval_class, learn_game,
    matrix_game, payoff_matrix, threshold_class,
)

ATOMS = 50


def small_game():
    """(H, R, atoms [k, 1], probs [k]): the support is the midpoints of 50 cells of [0, 1], weighted by Beta(2, 5)."""
    from scipy.stats import beta

    edges = np.linspace(0.0, 1.0, ATOMS + 1)
    probs = np.diff(beta(2.0, 5.0).cdf(edges))
    atoms = ((edges[:-1] + edges[1:]) / 2)[:, None]
    # grids offset from the atoms so that no atom sits on a threshold
    H = threshold_class(np.linspace(0.0, 1.0, 21) + 0.005)
    R = interval_class(np.linspace(0.0, 1.0, 11) + 0.005)
    return H, R, atoms, probs / probs.sum()


def epsilon_m(m: int, H, R, atoms, probs, rng: np.random.Generator, draws: int) -> float:
    """The corollary's eps(m) = rad_m(F) + sqrt(log m / m) (O(.) read as 1), F = {|h - r|}: Monte-Carlo over one
    sample of m atoms and `draws` sign vectors."""
    hv, rv = class_values(list(H), atoms), class_values(list(R), atoms)
    F = np.abs(hv[:, None, :] - rv[None, :, :]).reshape(-1, len(atoms))  # [|H||R|, k]
    idx = rng.choice(len(atoms), size=m, p=probs)
    return empirical_rademacher(F, idx, draws, rng) + math.sqrt(math.log(m) / m)


def run_game(ms, seeds: int, seed: int, budget: int, draws: int):
    """Per learner and m: lists over seeds of the duality gap, the two exploitabilities, |value estimate - V*|;
    plus eps(m) per m (mean over seeds), the LP solution and its primal-dual difference."""
    H, R, atoms, probs = small_game()
    M = payoff_matrix(H, R, atoms, probs)
    sol = matrix_game(M)
    oracle = FiniteClassOracle(H, dim=1)
    learners = {
        "ftrl": lambda m: HybridFTRL(oracle, "absolute", m, max_iter=budget),
        "ftl": lambda m: FollowTheLeader(oracle, "absolute", m, max_iter=budget),
    }
    out = {name: {m: {"gap": [], "row": [], "col": [], "value_err": []} for m in ms} for name in learners}
    eps = {m: [] for m in ms}
    for i in range(seeds):
        for m in ms:
            for name, make in learners.items():
                g = learn_game(make, H, R, atoms, probs, m, np.random.default_rng(seed + i * 1000 + m), sol)
                rec = out[name][m]
                rec["gap"].append(g.duality_gap)
                rec["row"].append(g.exploitability_row)
                rec["col"].append(g.exploitability_col)
                rec["value_err"].append(abs(g.value_estimate - sol.value))
            eps[m].append(epsilon_m(m, H, R, atoms, probs, np.random.default_rng(seed + 99 + i * 1000 + m), draws))
    return out, {m: float(np.mean(v)) for m, v in eps.items()}, sol, M
