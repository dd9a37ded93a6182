"""Forward predictive resampling (the card's Algorithm 1): simulate the deployment's future under the predictive rule.

Each path starts from the n observed scores and appends M imputed ones; step i draws a fresh model score with
probability alpha / (i - 1 + alpha), otherwise a uniform draw from the pool so far (observed and imputed values).
theta^(b) = mean of the n + M pool values. Only scores are stored, never inputs. The paths of all data sets and
draws run together, vectorised over paths and sequential over the M steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rankwise.algorithms.martingale_posterior._checks import as_alpha, as_rng, as_scores, check_count
from rankwise.algorithms.martingale_posterior.generators import ScoreGenerator, draw_scores

MAX_BLOCK = 4_000_000  # float64 values per block of paths x steps: bounds the memory (~100 MB for pool + draws)


def forward_resample(scores: Any, generator: ScoreGenerator, alpha: Any, *, draws: int = 200, horizon: int = 1000,
                     seed: int | np.random.Generator | None = None, trajectory: bool = False) -> np.ndarray:
    """Martingale-posterior draws theta^(b) of the metric after `horizon` more forecasts.

    scores: [n] or [T, n] (T independent data sets); alpha: scalar or [T]. Returns [draws] or [T, draws]; with
    `trajectory`, the running pool means after each step as well, [..., draws, horizon + 1] (entry i is the mean of
    the first n + i pool values; the forecast along the path is theta(P_t) = (t mean_t + alpha theta(Q)) / (t + alpha)).
    As horizon -> inf the draws converge in distribution to the Dirichlet shortcut's `dp_mean` draws; the
    finite-horizon gap is bounded by `drift_bound(n + horizon, ...)`.
    """
    z = as_scores(scores)
    single = z.ndim == 1
    z2 = z[None] if single else z
    t, n = z2.shape
    a = as_alpha(alpha, None if single else t)
    draws, horizon = check_count(draws, "draws"), check_count(horizon, "horizon", 0)
    rng = as_rng(seed)
    # One path per (data set, draw), data set-major, so the result reshapes to [T, draws].
    path_data = np.repeat(np.arange(t), draws)
    out = np.empty((t * draws, horizon + 1) if trajectory else t * draws)
    per_block = max(1, MAX_BLOCK // max(1, n + horizon))
    for start in range(0, t * draws, per_block):
        rows = path_data[start:start + per_block]
        pool = _run_paths(z2[rows], a[rows], horizon, generator, rng)  # [n + M, P]
        if trajectory:
            counts = np.arange(n, n + horizon + 1, dtype=np.float64)
            out[start:start + rows.size] = (np.cumsum(pool, 0)[n - 1:] / counts[:, None]).T
        else:
            out[start:start + rows.size] = pool.mean(0)
    shape = (t, draws, horizon + 1) if trajectory else (t, draws)
    return out.reshape(shape)[0] if single else out.reshape(shape)


def _run_paths(z: np.ndarray, a: np.ndarray, horizon: int, generator: ScoreGenerator,
               rng: np.random.Generator) -> np.ndarray:
    """z [P, n] starting pools, a [P] alphas -> the pools after `horizon` steps, step-major [n + horizon, P]."""
    p, n = z.shape
    # Step-major storage [n + M, P]: each step writes one contiguous row, and a uniform pick from the pool is one
    # flat `take` (step * P + path).
    pool = np.empty((n + horizon, p))
    pool[:n] = z.T
    if horizon == 0:
        return pool
    flat = pool.reshape(-1)
    # lambda depends only on the step and alpha, so every coin (model draw or not) is tossed up front, and the
    # generator is called once for all the model draws of the block instead of once per step.
    steps = np.arange(horizon, dtype=np.float64)[:, None]
    denom = n + steps + a[None, :]
    lam = np.divide(np.broadcast_to(a[None, :], denom.shape), denom, out=np.zeros((horizon, p)), where=denom > 0)
    use_model = rng.random((horizon, p)) < lam
    model_vals = np.zeros((horizon, p))
    model_vals[use_model] = draw_scores(generator, int(use_model.sum()), rng)
    paths = np.arange(p, dtype=np.int64)
    u = np.empty(p)
    for i in range(horizon):
        size = n + i  # the pool holds the n observations and the i values imputed so far
        rng.random(out=u)
        idx = (u * size).astype(np.int64)
        idx *= p
        idx += paths
        pool[size] = np.where(use_model[i], model_vals[i], flat.take(idx))
    return pool
