"""Loss curves and their normalisation: causal EMA smoothing, l(t_hat) = L(t_hat T) / L(T), a common t_hat grid, and
the collapse spread of a family of curves.

A `Curve` is a training-loss curve on the fraction-of-training axis t_hat in (0, 1] (tokens seen / total tokens),
so curves of runs with different lengths can be compared: `on_grid` resamples them onto one grid. Functions that
take bare arrays of losses (no axis) need them to be the same length and refuse anything else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rankwise.errors import InvalidInputError, NumericalError


def _finite_1d(values: Sequence[float] | np.ndarray, what: str, min_len: int = 1) -> np.ndarray:
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{what} must be a sequence of numbers") from None
    if x.ndim != 1 or x.size < min_len:
        raise InvalidInputError(f"{what} must be 1-D with at least {min_len} value(s), got shape {x.shape}")
    bad = np.flatnonzero(~np.isfinite(x))
    if bad.size:
        raise NumericalError(f"{what} has non-finite values (first at index {int(bad[0])}: {x[bad[0]]}); a diverged run "
                             "has no normalised curve: drop it or fix the run")
    return x


def same_length(a: np.ndarray, b: np.ndarray, what_a: str, what_b: str) -> None:
    """Refuse two per-step arrays of different lengths (they are compared point by point)."""
    if a.shape != b.shape:
        raise InvalidInputError(f"{what_a} has {a.size} points but {what_b} has {b.size}: curves of different lengths "
                                "cannot be compared point by point; put both on one t_hat grid first (Curve.on_grid)")


@dataclass(frozen=True)
class Curve:
    """A loss curve: `t_hat` [n] increasing in (0, 1] (fraction of training tokens) and `loss` [n], float64."""

    t_hat: np.ndarray
    loss: np.ndarray

    def __post_init__(self) -> None:
        t = _finite_1d(self.t_hat, "t_hat", 2)
        y = _finite_1d(self.loss, "loss", 2)
        same_length(t, y, "t_hat", "loss")
        if np.any(np.diff(t) <= 0) or t[0] <= 0 or t[-1] > 1 + 1e-12:
            raise InvalidInputError(f"t_hat must increase strictly within (0, 1], got [{t[0]}, ..., {t[-1]}]")
        object.__setattr__(self, "t_hat", t)
        object.__setattr__(self, "loss", y)

    @classmethod
    def from_steps(cls, losses: Sequence[float], tokens: Sequence[float] | None = None) -> Curve:
        """A curve from per-step losses [T] and the cumulative tokens after each step [T] (default: equal steps)."""
        y = _finite_1d(losses, "losses", 2)
        tok = np.arange(1, y.size + 1, dtype=np.float64) if tokens is None else _finite_1d(tokens, "tokens", 2)
        same_length(y, tok, "losses", "tokens")
        if tok[-1] <= 0:
            raise InvalidInputError("tokens must end positive (cumulative training tokens)")
        return cls(tok / tok[-1], y)

    @property
    def final(self) -> float:
        return float(self.loss[-1])

    def at(self, t_hat: np.ndarray | Sequence[float]) -> np.ndarray:
        """Linear interpolation of the loss at `t_hat` [m] (held constant before the first point)."""
        return np.interp(np.asarray(t_hat, dtype=np.float64), self.t_hat, self.loss)

    def on_grid(self, grid: np.ndarray | Sequence[float]) -> Curve:
        """The curve resampled on `grid` [m]: how curves of different lengths are put on one axis."""
        g = _finite_1d(grid, "grid", 2)
        return Curve(g, self.at(g))

    def window(self, lo: float, hi: float) -> Curve:
        """The points with lo <= t_hat <= hi."""
        keep = (self.t_hat >= lo) & (self.t_hat <= hi)
        if keep.sum() < 2:
            raise InvalidInputError(f"fewer than 2 points of the curve lie in t_hat [{lo}, {hi}]")
        return Curve(self.t_hat[keep], self.loss[keep])


def grid(points: int = 100, start: float | None = None) -> np.ndarray:
    """An even t_hat grid of `points` values ending at 1 (default start 1/points). -> [points]"""
    if points < 2:
        raise InvalidInputError(f"a grid needs at least 2 points, got {points}")
    return np.linspace(1.0 / points if start is None else start, 1.0, points)


def ema_smooth(curve: Curve, window: float) -> Curve:
    """Causal exponential moving average with a time constant of `window` in t_hat (the same for every run length).

    Per step the weight of the past is beta = exp(-dt / window), dt the step's t_hat increment; the average is
    bias-corrected (divided by the weight accumulated so far), so the first points are not pulled towards 0.
    The value at t_hat depends only on points at or before it.
    """
    if not (window > 0 and math.isfinite(window)):
        raise InvalidInputError(f"the smoothing window must be a positive fraction of training, got {window}")
    dt = np.diff(curve.t_hat, prepend=0.0)
    out = np.empty_like(curve.loss)
    acc, weight = 0.0, 0.0
    for i, (x, d) in enumerate(zip(curve.loss, dt)):
        beta = math.exp(-d / window)
        acc, weight = beta * acc + (1 - beta) * x, beta * weight + (1 - beta)
        out[i] = acc / weight
    return Curve(curve.t_hat, out)


def normalise(curve: Curve, offset: float = 0.0, divisor: float | None = None) -> Curve:
    """l(t_hat) = (L(t_hat) - offset) / (divisor - offset), divisor = L(1) by default, so l(1) = 1.

    The paper's choice is offset = 0 (no irreducible-loss term). Pass `divisor` (a predicted final loss) to
    normalise a run that has not finished.
    """
    d = curve.final if divisor is None else float(divisor)
    if not math.isfinite(offset) or not math.isfinite(d) or d - offset <= 0:
        raise InvalidInputError(f"normalising needs a finite divisor above the offset, got divisor {d}, offset {offset}")
    return Curve(curve.t_hat, (curve.loss - offset) / (d - offset))


def stack(curves: Sequence[Curve], on: np.ndarray) -> np.ndarray:
    """The curves resampled on one grid `on` [m]. -> [len(curves), m]"""
    if len(curves) == 0:
        raise InvalidInputError("no curves given")
    return np.stack([c.at(on) for c in curves])


def reference_curve(curves: Sequence[Curve], on: np.ndarray) -> Curve:
    """The pointwise mean of (normalised) curves on the grid `on`: the collapse reference l_ref."""
    return Curve(np.asarray(on, dtype=np.float64), stack(curves, on).mean(0))


def collapse_spread(curves: Sequence[Curve], on: np.ndarray | None = None, lo: float = 0.2, hi: float = 1.0) -> float:
    """Mean over t_hat in [lo, hi] of the across-curve standard deviation (ddof 0) of the curves.

    Pass normalised curves: the card's collapse metric. The curves may have different lengths (runs of different
    sizes); they are compared on `on` (default 100 even points).
    """
    if len(curves) < 2:
        raise InvalidInputError(f"a spread needs at least 2 curves, got {len(curves)}")
    g = grid(100) if on is None else np.asarray(on, dtype=np.float64)
    g = g[(g >= lo) & (g <= hi)]
    if g.size == 0:
        raise InvalidInputError(f"no grid point lies in [{lo}, {hi}]")
    return float(stack(curves, g).std(axis=0).mean())
