"""From training runs to the reproduction's numbers: smoothed and normalised curves, collapse spreads, the fault
detector's alarms and the early-stopping ranking. Pure functions of `RunResult`s, on the recipe API."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import spearmanr

from rankwise.recipes.loss_curve_collapse import (
    Curve,
    collapse_spread,
    ema_smooth,
    first_alarm,
    fit_divisor,
    grid,
    normalise,
    reference_curve,
    residual,
    rise_alarm,
    stack,
)
from rankwise.repro.loss_curve_collapse.family import RunResult

GRID = grid(200)


def smoothed(run: RunResult, window: float) -> Curve:
    return ema_smooth(run.curve, window)


def normalised(run: RunResult, window: float) -> Curve:
    return normalise(smoothed(run, window))


def spread(runs: Sequence[RunResult], window: float, lo: float) -> float:
    """The card's collapse metric over a family (one run per size, different lengths)."""
    return collapse_spread([normalised(r, window) for r in runs], GRID, lo=lo)


def band_from(runs: Sequence[RunResult], window: float, lo: float, factor: float) -> float:
    """factor x the largest (over t_hat in [lo, 1]) across-run std of the normalised curves of `runs` (the small
    members over seeds): the seed-to-seed band of the declared detector."""
    g = GRID[GRID >= lo]
    return float(factor * stack([normalised(r, window) for r in runs], g).std(axis=0).max())


@dataclass(frozen=True)
class Alarm:
    residual_at: float | None  # first t_hat where |rho| > band in the monitored window
    raw_at: float | None  # first t_hat where the smoothed raw loss rises > band above its running minimum
    max_abs_residual: float


def alarms(run: RunResult, reference: Curve, window: float, fit: tuple[float, float], monitor: tuple[float, float],
           band: float) -> Alarm:
    """The detector on one run: divisor fitted on t_hat in `fit` (before any fault), then rho watched in `monitor`."""
    s = smoothed(run, window)
    c = fit_divisor(s, reference, upto=fit[1], start=fit[0])
    rho = residual(s, reference, c)
    mon = rho.window(*monitor)
    return Alarm(first_alarm(rho, band, *monitor), rise_alarm(s, band, *monitor), float(np.abs(mon.loss).max()))


def reference_from(runs: Sequence[RunResult], window: float) -> Curve:
    return reference_curve([normalised(r, window) for r in runs], GRID)


@dataclass(frozen=True)
class EarlyStop:
    spearman: float
    regret: float  # relative: (true final of the early pick - best true final) / best true final
    abs_rel_error: float  # mean over configs of |predicted - true| / true
    predicted: tuple[float, ...]
    true: tuple[float, ...]


def early_stop(big: Sequence[RunResult], small: Sequence[RunResult], window: float, fraction: float) -> EarlyStop:
    """Predict each big run's final (smoothed) training loss from its first `fraction` of training, aligned to the
    normalised curve of the small run with the same configuration; rank the configurations by it."""
    pred, true = [], []
    for b, s in zip(big, small, strict=True):
        ref = normalised(s, window)
        sb = smoothed(b, window)
        pred.append(fit_divisor(sb, ref, upto=fraction))
        true.append(sb.final)
    p, t = np.asarray(pred), np.asarray(true)
    rho = float(spearmanr(p, t).statistic) if np.ptp(p) > 0 and np.ptp(t) > 0 else 0.0
    regret = float((t[int(np.argmin(p))] - t.min()) / t.min())
    return EarlyStop(rho, regret, float(np.mean(np.abs(p - t) / t)), tuple(pred), tuple(true))
