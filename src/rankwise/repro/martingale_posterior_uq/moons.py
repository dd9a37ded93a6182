"""Reproduction A's synthetic deployment: F* = two moons (noise 0.1); the frozen generator Q = a Gaussian KDE
(bandwidth 0.15) on 5,000 "pre-training" points of a noisier, x-shifted moons (noise 0.2, shift s), so that the
mismatch Delta = theta(Q) - theta(F*) is set by s. Scores: h_alert(x) = 1{x_2 > 0.5}, h_sigmoid(x) = sigmoid(3 x_1),
and h_anomaly(x) = min(1, d(x) / 0.5) with d the distance from x to the nearer moon's centre curve: an
out-of-distribution score with a small spread under F* (its noise is 0.1) that the generator's samples, drawn off the
curves, score far higher. It is the analogue of the paper's per-token NLL under GPT-2, whose own samples score far
from the real texts: a mismatch of many standard errors, the regime of the paper's 37% bootstrap coverage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rankwise.algorithms.martingale_posterior import PoolGenerator

ANOMALY_SCALE = 0.5  # the distance from the curves that scores 1


def _arc_distance(p: np.ndarray, centre: tuple[float, float], upper: bool) -> np.ndarray:
    """Distance [k] from points p [k, 2] to the unit half circle around `centre` (its upper or lower half)."""
    q = p - np.asarray(centre)
    on_side = q[:, 1] >= 0 if upper else q[:, 1] <= 0
    to_circle = np.abs(np.hypot(q[:, 0], q[:, 1]) - 1.0)
    to_ends = np.minimum(np.hypot(q[:, 0] - 1.0, q[:, 1]), np.hypot(q[:, 0] + 1.0, q[:, 1]))
    return np.where(on_side, to_circle, to_ends)


def anomaly(x: np.ndarray) -> np.ndarray:
    """min(1, d / 0.5), d = distance [k] from x [k, 2] to the nearer of the two moons' centre curves."""
    d = np.minimum(_arc_distance(x, (0.0, 0.0), upper=True), _arc_distance(x, (1.0, 0.5), upper=False))
    return np.minimum(1.0, d / ANOMALY_SCALE)


SCORES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "alert": lambda x: (x[:, 1] > 0.5).astype(np.float64),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-3.0 * x[:, 0])),
    "anomaly": anomaly,
}
SUPPORT = {"alert": (0.0, 1.0), "sigmoid": (0.0, 1.0), "anomaly": (0.0, 1.0)}


def moons(k: int, noise: float, rng: np.random.Generator, shift: float = 0.0) -> np.ndarray:
    """k i.i.d. points [k, 2] of two interleaved half circles (each point's moon is a fair coin, unlike
    sklearn's make_moons, which splits k exactly in half), plus N(0, noise^2 I)."""
    upper = rng.random(k) < 0.5
    t = rng.random(k) * np.pi
    x = np.where(upper, np.cos(t), 1.0 - np.cos(t)) + shift
    y = np.where(upper, np.sin(t), 0.5 - np.sin(t))
    return np.stack([x, y], 1) + noise * rng.standard_normal((k, 2))


@dataclass(frozen=True)
class World:
    score: str
    shift: float
    theta_true: float  # theta(F*) from `truth_samples` draws
    generator: PoolGenerator  # i.i.d. draws from a pre-drawn pool of KDE-sample scores; its mean is theta(Q)
    sigma: float  # sd of h under F*

    @property
    def delta(self) -> float:
        return self.generator.mean - self.theta_true

    def draw_real(self, rng: np.random.Generator, reps: int, n: int) -> np.ndarray:
        return SCORES[self.score](moons(reps * n, 0.1, rng)).reshape(reps, n)


def make_world(score: str, shift: float, pool: int, truth_samples: int, rng: np.random.Generator) -> World:
    h = SCORES[score]
    pre = moons(5000, 0.2, rng, shift)
    kde = pre[rng.integers(0, pre.shape[0], pool)] + 0.15 * rng.standard_normal((pool, 2))
    truth = h(moons(truth_samples, 0.1, rng))
    return World(score, shift, float(truth.mean()), PoolGenerator(h(kde)), float(truth.std()))
