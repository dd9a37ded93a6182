"""The frozen generator, as the martingale posterior sees it: a callable that returns scores h(y) of fresh samples.

    generator(size, rng) -> array [size] of scores h(y_1..y_size), y_j ~ Q_phi i.i.d.

Only sampling is needed (no densities). The generator must stay frozen while it is used: an online update or a
changed decoding breaks the martingale property. `PoolGenerator` draws with replacement from a pre-computed pool of
model scores (exact i.i.d. draws from the pool's empirical law: the way a slow generator, e.g. an LLM, is used once
and cached); `ScoredGenerator` composes a sampler of raw samples with a score function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from rankwise.algorithms.martingale_posterior._checks import as_scores
from rankwise.errors import InvalidInputError, NumericalError, RankwiseError


class ScoreGenerator(Protocol):
    def __call__(self, size: int, rng: np.random.Generator) -> Any: ...


def draw_scores(generator: ScoreGenerator, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` model scores from `generator`, checked: float64 [size], all finite.

    A generator that raises, returns nothing (None, an empty array) or the wrong number of scores is refused with an
    `InvalidInputError` naming what it returned; non-finite scores raise `NumericalError`.
    """
    if size == 0:
        return np.empty(0)
    try:
        out = generator(size, rng)
    except RankwiseError:
        raise
    except Exception as e:  # a user callable: say which call failed, keep the cause
        raise InvalidInputError(f"the generator raised {type(e).__name__} when asked for {size} scores: {e}") from e
    if out is None:
        raise InvalidInputError(f"the generator returned None when asked for {size} scores; it must return an "
                                "array of `size` scores")
    try:
        z = np.asarray(out, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise InvalidInputError(f"the generator returned {type(out).__name__}, not numbers") from None
    if z.size == 0:
        raise InvalidInputError(f"the generator returned no scores when asked for {size}; check that it samples")
    if z.size != size:
        raise InvalidInputError(f"the generator returned {z.size} scores when asked for {size}")
    if not np.all(np.isfinite(z)):
        raise NumericalError("the generator returned non-finite scores; clip the score (e.g. NLL to [0, 15])")
    return z


class PoolGenerator:
    """Draws i.i.d. with replacement from a fixed pool of model scores [P]; its exact mean is `pool.mean()`."""

    def __init__(self, pool: Any):
        self.pool = as_scores(pool, "generator pool")
        if self.pool.ndim != 1:
            raise InvalidInputError(f"a generator pool must be one score per sample [P], got shape {self.pool.shape}")

    def __call__(self, size: int, rng: np.random.Generator) -> np.ndarray:
        return self.pool[rng.integers(0, self.pool.size, size)]

    @property
    def mean(self) -> float:
        return float(self.pool.mean())

    @property
    def variance(self) -> float:
        return float(self.pool.var())


class ScoredGenerator:
    """`score(sample(size, rng))`: a sampler of raw samples (e.g. points [size, d]) and the deployed score h."""

    def __init__(self, sample: Callable[[int, np.random.Generator], Any], score: Callable[[Any], Any]):
        self.sample, self.score = sample, score

    def __call__(self, size: int, rng: np.random.Generator) -> Any:
        return self.score(self.sample(size, rng))


def model_moments(generator: ScoreGenerator, samples: int, rng: np.random.Generator) -> tuple[float, float]:
    """(mean, unbiased variance) of h under Q from `samples` fresh draws: the theta(Q) the forecast shrinks toward."""
    z = draw_scores(generator, samples, rng)
    if z.size < 2:
        raise InvalidInputError(f"model_samples must be >= 2 to estimate theta(Q) and its spread, got {samples}")
    return float(z.mean()), float(z.var(ddof=1))
