"""The hybrid online protocol and regret against the best fixed hypothesis in hindsight.

Round t: the learner decides h_t in conv(H); the adversary picks r_t in R (seeing h_t and the past, not x_t); x_t ~ D
is drawn; the learner suffers l(h_t(x_t), r_t(x_t)) and observes x_t and the whole function r_t.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rankwise.algorithms.hybrid_online.hypotheses import as_points
from rankwise.algorithms.hybrid_online.learners import EmpiricalLearner
from rankwise.algorithms.hybrid_online.losses import Loss, get_loss
from rankwise.algorithms.hybrid_online.oracles import LinearOracle, call_oracle
from rankwise.errors import InvalidInputError


@dataclass
class Play:
    X: np.ndarray  # [T, d] the drawn points
    predictions: np.ndarray  # [T] h_t(x_t)
    labels: np.ndarray  # [T] r_t(x_t)
    losses: np.ndarray  # [T] l(h_t(x_t), r_t(x_t))
    calls: np.ndarray  # [T] oracle calls per round
    seconds: float

    @property
    def learner_loss(self) -> float:
        return float(self.losses.sum())


def play(learner: EmpiricalLearner, adversary, draw: Callable[[np.random.Generator], np.ndarray], horizon: int,
         rng: np.random.Generator) -> Play:
    """Run `horizon` rounds. draw(rng) -> x_t [d] (one i.i.d. sample of D)."""
    if not isinstance(horizon, int) or horizon < 1:
        raise InvalidInputError(f"horizon must be a positive int, got {horizon!r}")
    xs, ps, ys = [], [], []
    t0 = time.perf_counter()
    for t in range(horizon):
        h = learner.decide()
        r = adversary.choose(t, h)  # before x_t exists: r_t cannot depend on it
        x = as_points(np.reshape(np.asarray(draw(rng), dtype=np.float64), (1, -1)), what="x_t")
        ps.append(float(h.predict(x)[0]))
        ys.append(float(r.predict(x)[0]))
        learner.observe(x[0], r)
        xs.append(x[0])
    seconds = time.perf_counter() - t0
    p, y = np.asarray(ps), np.asarray(ys)
    return Play(np.stack(xs), p, y, learner.loss.value(p, y), np.asarray(learner.calls[-horizon:]), seconds)


def best_fixed_loss(oracle: LinearOracle, X, labels, loss: str | Loss = "absolute") -> tuple[float, object]:
    """min_{h in H} sum_t l(h(x_t), y_t) for a {0,1}-valued class H with an exact oracle, and the minimiser.

    For binary h both losses are h (1 - 2y) + l(0, y), so the comparator is one oracle call with costs 1 - 2y.
    """
    x = as_points(X)
    y = get_loss(loss).check_labels(labels)
    if y.shape != (len(x),):
        raise InvalidInputError(f"labels must be [T] with T = {len(x)}, got shape {y.shape}")
    h = call_oracle(oracle, x, 1.0 - 2.0 * y)
    hv = np.asarray(h.predict(x), dtype=np.float64)
    if np.any((hv != 0) & (hv != 1)):
        raise InvalidInputError("best_fixed_loss needs a {0,1}-valued class (the comparator's values were fractional)")
    return float(get_loss(loss).value(hv, y).sum()), h


def regret(run: Play, oracle: LinearOracle, loss: str | Loss = "absolute") -> float:
    """sum_t l(h_t(x_t), r_t(x_t)) - min_{h in H} sum_t l(h(x_t), r_t(x_t)) on the realised x_t and r_t."""
    best, _ = best_fixed_loss(oracle, run.X, run.labels, loss)
    return run.learner_loss - best
