"""The Dirichlet-mean shortcut ("DWS", the card's Remark 5) for linear metrics theta(F) = int h dF.

The M -> inf limit of forward resampling is theta_inf = w_0 theta(G) + sum_i w_i z_i with
(w_0, w_1..w_n) ~ Dir(alpha, 1, ..., 1) and, independently, G ~ DP(alpha, Q). Two readings of the model term:

- `dp_mean` (the exact limit): theta(G) by stick-breaking, pi_k = V_k prod_{j<k} (1 - V_j), V ~ Beta(1, alpha),
  truncated after K sticks with the remainder on one more atom. Truncation only adds variance, E[R_K^2] alpha/(alpha+1)
  Var_Q(h) with E[R_K^2] = (alpha/(alpha+2))^K; K is the smallest count that keeps this below `tol` (1%) of the exact
  Var theta(G) = Var_Q(h)/(alpha+1). (The card's alternative, 200 atoms with Dir(alpha/200) weights, overstates that
  variance by the factor 1 + alpha/200: 2x at alpha = 200.)
- `single` (the authors' code): one fresh model score per draw, Var = Var_Q(h), over-dispersed by alpha + 1.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rankwise.algorithms.martingale_posterior._checks import as_alpha, as_rng, as_scores, check_count
from rankwise.algorithms.martingale_posterior.generators import ScoreGenerator, draw_scores
from rankwise.errors import InvalidInputError

VARIANTS = ("dp_mean", "single")
MAX_BLOCK = 4_000_000  # stick weights per block: bounds the memory of one block (~100 MB)


def sticks_for(alpha: float, tol: float = 0.01) -> int:
    """Sticks K after which truncated stick-breaking overstates Var theta(G) by at most the fraction `tol`."""
    if not 0 < tol < 1:
        raise InvalidInputError(f"tol must be in (0, 1), got {tol}")
    if alpha <= 0:
        return 1
    if alpha <= tol:
        return 1
    return max(1, math.ceil(math.log(tol / alpha) / math.log(alpha / (alpha + 2.0))))


def dp_mean_draws(generator: ScoreGenerator, alpha: Any, size: int, *, tol: float = 0.01,
                  seed: int | np.random.Generator | None = None) -> np.ndarray:
    """`size` draws of theta(G), G ~ DP(alpha, Q), for each alpha: alpha scalar -> [size], alpha [T] -> [T, size]."""
    scalar = np.ndim(alpha) == 0
    a = as_alpha(alpha, None if scalar else int(np.size(alpha)))
    size = check_count(size, "size")
    rng = as_rng(seed)
    flat = np.repeat(a, size)
    out = np.empty(flat.size)
    # K grows like alpha log(alpha): process the draws in order of alpha so that a block of small alphas is not
    # charged the sticks of the largest one.
    order = np.argsort(flat, kind="stable")
    start = 0
    while start < flat.size:
        stop = flat.size
        while True:  # the longest run from `start` whose K (set by its largest alpha) fits in one block
            k = sticks_for(float(flat[order[stop - 1]]), tol)
            cap = start + max(1, MAX_BLOCK // (k + 1))
            if cap >= stop:
                break
            stop = cap
        sel = order[start:stop]
        out[sel] = _stick_breaking_means(generator, flat[sel], k, rng)
        start = stop
    return out[:size] if scalar else out.reshape(a.size, size)


def _stick_breaking_means(generator: ScoreGenerator, a: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """a [P] -> [P] draws of sum_k pi_k Q_k with K = k sticks and the remainder on atom K+1."""
    p = a.size
    # 1 - V_j = U_j^(1/alpha), so the mass left after j sticks is exp(-(E_1 + ... + E_j) / alpha), E ~ Exp(1).
    safe = np.where(a > 0, a, 1.0)  # alpha = 0 puts no mass on the model term: any finite value will do
    left = np.exp(-np.cumsum(rng.standard_exponential((p, k)), axis=1) / safe[:, None])
    weights = np.empty((p, k + 1))
    weights[:, 0] = 1.0 - left[:, 0]
    weights[:, 1:k] = left[:, :-1] - left[:, 1:]
    weights[:, k] = left[:, -1]
    atoms = draw_scores(generator, p * (k + 1), rng).reshape(p, k + 1)
    return (weights * atoms).sum(1)


def dirichlet_shortcut(scores: Any, generator: ScoreGenerator, alpha: Any, *, draws: int = 1000,
                       variant: str = "dp_mean", tol: float = 0.01,
                       seed: int | np.random.Generator | None = None) -> np.ndarray:
    """Draws of theta_inf = w_0 Z_0 + sum_i w_i z_i, (w_0, w) ~ Dir(alpha, 1, ..., 1).

    scores [n] or [T, n]; alpha scalar or [T]; Z_0 = theta(G) (`dp_mean`) or one model score (`single`).
    Returns [draws] or [T, draws]. alpha = 0 gives the Bayesian bootstrap; alpha -> inf collapses to theta(Q).
    """
    z = as_scores(scores)
    single = z.ndim == 1
    z2 = z[None] if single else z
    t, n = z2.shape
    a = as_alpha(alpha, None if single else t)
    draws = check_count(draws, "draws")
    if variant not in VARIANTS:
        raise InvalidInputError(f"variant must be one of {VARIANTS}, got {variant!r}")
    rng = as_rng(seed)
    if variant == "dp_mean":
        z0_all = dp_mean_draws(generator, a, draws, tol=tol, seed=rng)  # [T, draws]
    else:
        z0_all = draw_scores(generator, t * draws, rng).reshape(t, draws)
    out = np.empty((t, draws))
    per_block = max(1, MAX_BLOCK // max(1, draws * (n + 1)))
    for start in range(0, t, per_block):
        zb, ab = z2[start:start + per_block], a[start:start + per_block]
        g0 = rng.gamma(np.broadcast_to(ab[:, None], (ab.size, draws)))  # Gamma(0) = 0: no model mass at alpha = 0
        e = rng.standard_exponential((ab.size, draws, n))
        z0 = z0_all[start:start + ab.size]
        out[start:start + ab.size] = (g0 * z0 + np.einsum("tbn,tn->tb", e, zb)) / (g0 + e.sum(-1))
    return out[0] if single else out
