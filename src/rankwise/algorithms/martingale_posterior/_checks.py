"""Input checks shared by the martingale-posterior functions: scores, alpha, levels, draw counts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rankwise.errors import InvalidInputError, NumericalError


def as_scores(scores: Any, what: str = "scores") -> np.ndarray:
    """`scores` as float64 [n] or [T, n] (T independent data sets of n scores each), n >= 1, all finite."""
    try:
        z = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{what} must be numbers, got {type(scores).__name__}") from None
    if z.ndim not in (1, 2):
        raise InvalidInputError(f"{what} must be [n] or [T, n], got shape {z.shape}")
    if z.shape[-1] == 0 or z.size == 0:
        raise InvalidInputError(f"{what} is empty (n = 0): give at least one observed score")
    if not np.all(np.isfinite(z)):
        bad = np.argwhere(~np.isfinite(z))[:3].tolist()
        raise NumericalError(f"{what} holds non-finite values (first at {bad}); clip or drop them before calling")
    return z


def as_alpha(alpha: Any, batch: int | None) -> np.ndarray:
    """alpha as float64 [T] (or [1] for one data set): finite and >= 0, a scalar broadcast over the T data sets."""
    try:
        a = np.asarray(alpha, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidInputError(f"alpha must be a number or one number per data set, got {alpha!r}") from None
    t = 1 if batch is None else batch
    if a.ndim == 0:
        a = np.full(t, float(a))
    if a.shape != (t,):
        raise InvalidInputError(f"alpha must be a scalar or have shape ({t},), got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise InvalidInputError(f"alpha must be finite and >= 0, got {a.tolist()[:5]}")
    return a


def check_level(level: float) -> tuple[float, float]:
    """The (lower, upper) quantile probabilities of a central interval at `level` in (0, 1)."""
    if not isinstance(level, (int, float)) or not math.isfinite(level) or not 0.0 < level < 1.0:
        raise InvalidInputError(f"level must be in (0, 1), e.g. 0.9, got {level!r}")
    return (1.0 - level) / 2.0, (1.0 + level) / 2.0


def check_count(value: Any, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidInputError(f"{what} must be an int >= {minimum}, got {value!r}")
    return int(value)


def as_rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise InvalidInputError(f"seed must be an int, a numpy Generator or None, got {seed!r}")
    return np.random.default_rng(seed)
