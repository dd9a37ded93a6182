"""[0,1]-valued hypotheses on points X [n, d], and finite mixtures of them (the members of conv(H)).

A hypothesis is any object with `predict(X [n, d]) -> [n]` in [0, 1] and a hashable `key` (None when it has none):
equal keys mean equal functions, so a mixture can merge repeated oracle answers instead of growing by one component
per Frank-Wolfe step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Protocol, runtime_checkable

import numpy as np

from rankwise.errors import InvalidInputError


@runtime_checkable
class Hypothesis(Protocol):
    key: Hashable | None

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Values in [0, 1] at the rows of X [n, d] -> [n] float64."""
        ...


def as_points(X: Any, d: int | None = None, what: str = "X") -> np.ndarray:
    """X as a float64 [n, d] array; a 1-D array is n points of dimension 1. Non-finite entries are refused."""
    try:
        x = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{what} must be an array of numbers, got {type(X).__name__}") from None
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise InvalidInputError(f"{what} must be [n, d] (or [n] for d = 1), got shape {x.shape}")
    if d is not None and x.shape[1] != d:
        raise InvalidInputError(f"{what} has {x.shape[1]} features, expected {d}")
    if not np.all(np.isfinite(x)):
        raise InvalidInputError(f"{what} has NaN or Inf entries")
    return x


@dataclass(frozen=True)
class Stump:
    """x -> 1{x[feature] >= threshold} (sign = +1) or 1{x[feature] < threshold} (sign = -1). With d = 1 and sign +1
    this is the card's threshold h_theta; threshold = +inf with sign +1 is the constant 0."""

    feature: int
    threshold: float
    sign: int = 1

    @property
    def key(self) -> Hashable:
        return ("stump", self.feature, self.threshold, self.sign)

    def predict(self, X: np.ndarray) -> np.ndarray:
        above = X[:, self.feature] >= self.threshold
        return (above if self.sign > 0 else ~above).astype(np.float64)


@dataclass(frozen=True)
class Interval:
    """x -> 1{low <= x[feature] <= high} (the card's richer label class R)."""

    feature: int
    low: float
    high: float

    @property
    def key(self) -> Hashable:
        return ("interval", self.feature, self.low, self.high)

    def predict(self, X: np.ndarray) -> np.ndarray:
        x = X[:, self.feature]
        return ((x >= self.low) & (x <= self.high)).astype(np.float64)


@dataclass(frozen=True)
class Constant:
    """x -> value (value in [0, 1])."""

    value: float

    @property
    def key(self) -> Hashable:
        return ("constant", self.value)

    def predict(self, X: np.ndarray) -> np.ndarray:
        return np.full(X.shape[0], self.value, dtype=np.float64)


def threshold_class(grid: Any) -> list[Stump]:
    """H = {1{x >= theta} : theta in grid} on d = 1 (the card's 201-point grid on [0, 1])."""
    return [Stump(0, float(t), 1) for t in np.asarray(grid, dtype=np.float64)]


def interval_class(grid: Any) -> list[Interval]:
    """R = {1{a <= x <= b} : a <= b in grid} on d = 1."""
    g = [float(v) for v in np.asarray(grid, dtype=np.float64)]
    return [Interval(0, a, b) for i, a in enumerate(g) for b in g[i:]]


def class_values(members: list, X: np.ndarray) -> np.ndarray:
    """[len(members), n]: every member's values at the rows of X."""
    return np.stack([np.asarray(h.predict(X), dtype=np.float64) for h in members]) if members else np.zeros((0, len(X)))


@dataclass
class Mixture:
    """A point of conv(H): sum_i weights[i] * components[i], weights >= 0 summing to 1. Components with equal keys
    are merged; components whose weight falls to 0 are dropped."""

    components: list = field(default_factory=list)
    weights: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, h) -> Mixture:
        return cls([h], [1.0])

    def __len__(self) -> int:
        return len(self.components)

    def step_towards(self, h, gamma: float) -> None:
        """self <- (1 - gamma) self + gamma h (a Frank-Wolfe step), in place."""
        w = [(1.0 - gamma) * v for v in self.weights]
        comps = list(self.components)
        key = getattr(h, "key", None)
        idx = next((i for i, c in enumerate(comps) if key is not None and getattr(c, "key", None) == key), None)
        if idx is None:
            comps.append(h)
            w.append(gamma)
        else:
            w[idx] += gamma
        keep = [i for i, v in enumerate(w) if v > 0.0]
        total = sum(w[i] for i in keep)
        self.components = [comps[i] for i in keep]
        self.weights = [w[i] / total for i in keep]

    def predict(self, X: np.ndarray, cache: dict | None = None) -> np.ndarray:
        """Mixture values at the rows of X [n, d] -> [n]. `cache` (key -> values on this X) skips re-evaluating
        components already seen on the same X."""
        out = np.zeros(X.shape[0], dtype=np.float64)
        for h, w in zip(self.components, self.weights):
            k = getattr(h, "key", None)
            if cache is not None and k is not None:
                v = cache.get(k)
                if v is None:
                    v = cache[k] = np.asarray(h.predict(X), dtype=np.float64)
            else:
                v = np.asarray(h.predict(X), dtype=np.float64)
            out += w * v
        return out

    def copy(self) -> Mixture:
        return Mixture(list(self.components), list(self.weights))
