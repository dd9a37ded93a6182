"""The two-component mixture over unknown energies, and the old / mix / new partition it defines.

    mixture = EnergyMixture(window=256, ema=0.3)
    params = mixture.update(e)                 # e [B] float64: refit on the window of recent energies (EMA-smoothed)
    region = partition(e, params)              # [B] int64: OLD (e < mu_old), MIX, NEW (e > mu_new)
    p_new = params.posterior_new(e)            # [B]: the new component's responsibility

The fit is scikit-learn's GaussianMixture(2) on a sliding window of the most recent energies (the card's small-batch
remedy), its parameters smoothed by an EMA across batches. Two guards keep the fit from degenerating when a window
holds one mode only (a stretch of the stream with no new classes): a fit whose means are closer than `min_gap`, or
whose smaller component weighs less than `min_weight`, is not used, and the last good parameters stay; before any
good fit the prior is the window's quartiles (mu_old = Q1, mu_new = Q3).
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from rankwise.errors import InvalidInputError

OLD, MIX, NEW = 0, 1, 2
REGIONS = ("old", "mix", "new")
SIGMA_FLOOR = 1e-4


@dataclass(frozen=True)
class MixtureParams:
    """A 2-component 1-D Gaussian mixture with ordered means: mu_old <= mu_new; `weight_new` = 1 - pi."""

    mu_old: float
    mu_new: float
    sigma_old: float
    sigma_new: float
    weight_new: float

    def posterior_new(self, e: torch.Tensor) -> torch.Tensor:
        """The new component's responsibility [B] (float64) for energies e [B]."""
        e = e.double()
        log_old = math.log(1.0 - self.weight_new) - math.log(self.sigma_old) - 0.5 * ((e - self.mu_old) / self.sigma_old) ** 2
        log_new = math.log(self.weight_new) - math.log(self.sigma_new) - 0.5 * ((e - self.mu_new) / self.sigma_new) ** 2
        return torch.sigmoid(log_new - log_old)


def ordered(mu: tuple[float, float], sigma: tuple[float, float], weight: tuple[float, float]) -> MixtureParams:
    """The parameters with the lower-mean component first as "old" (a GMM's components come in no order)."""
    i, j = (0, 1) if mu[0] <= mu[1] else (1, 0)
    return MixtureParams(float(mu[i]), float(mu[j]), max(float(sigma[i]), SIGMA_FLOOR), max(float(sigma[j]), SIGMA_FLOOR),
                         float(min(max(weight[j], 1e-3), 1 - 1e-3)))


def fit_mixture(e: np.ndarray, seed: int = 0) -> MixtureParams:
    """One GaussianMixture(2) fit to energies e [N] (N >= 2), means ordered."""
    from sklearn.mixture import GaussianMixture

    x = np.asarray(e, dtype=np.float64).reshape(-1, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning on near-constant windows: the guards judge the fit
        gmm = GaussianMixture(2, covariance_type="full", random_state=seed, reg_covar=1e-6, max_iter=100).fit(x)
    mu = gmm.means_.ravel()
    sigma = np.sqrt(gmm.covariances_.ravel())
    return ordered((mu[0], mu[1]), (sigma[0], sigma[1]), tuple(gmm.weights_.ravel()))


class EnergyMixture:
    """A windowed, EMA-smoothed 2-component mixture with a fallback to the last good fit (module docstring).

    window: how many recent energies each fit sees; ema: the weight of a new fit (1: no smoothing); min_points: the
    fewest energies worth a fit; min_gap: the smallest mu_new - mu_old of a usable fit; min_weight: its smaller
    component's smallest weight."""

    def __init__(self, window: int = 256, ema: float = 0.3, min_points: int = 8, min_gap: float = 0.02,
                 min_weight: float = 0.05, seed: int = 0) -> None:
        if window < 2 or min_points < 2 or not 0.0 < ema <= 1.0 or min_gap < 0 or not 0.0 <= min_weight < 0.5:
            raise InvalidInputError(f"EnergyMixture needs window >= 2, min_points >= 2, 0 < ema <= 1, min_gap >= 0 and "
                                    f"0 <= min_weight < 0.5; got window={window}, min_points={min_points}, ema={ema}, "
                                    f"min_gap={min_gap}, min_weight={min_weight}")
        self.window: deque[float] = deque(maxlen=window)
        self.ema, self.min_points, self.min_gap, self.min_weight, self.seed = ema, min_points, min_gap, min_weight, seed
        self.params: MixtureParams | None = None
        self.fallbacks = 0  # fits refused by the guards (the last good parameters were kept)

    def usable(self, p: MixtureParams) -> bool:
        return p.mu_new - p.mu_old >= self.min_gap and min(p.weight_new, 1 - p.weight_new) >= self.min_weight

    def update(self, e: torch.Tensor) -> MixtureParams:
        """Add energies e [B] to the window, refit, smooth; return the parameters to partition this batch with."""
        values = e.detach().double().flatten().tolist()
        if not all(math.isfinite(v) for v in values):
            raise InvalidInputError("unknown energies must be finite")
        self.window.extend(values)
        data = np.asarray(self.window)
        if data.size >= self.min_points:
            fit = fit_mixture(data, self.seed)
            if self.usable(fit):
                self.params = fit if self.params is None else _blend(self.params, fit, self.ema)
            else:
                self.fallbacks += 1
        if self.params is None:  # no good fit yet: the window's quartiles as the two modes
            q1, q3 = (np.quantile(data, [0.25, 0.75]) if data.size else (0.0, 1.0))
            spread = max(float(np.std(data)) if data.size else 0.0, SIGMA_FLOOR)
            return MixtureParams(float(q1), float(max(q3, q1)), spread, spread, 0.5)
        return self.params


def _blend(old: MixtureParams, new: MixtureParams, ema: float) -> MixtureParams:
    mix = lambda a, b: (1 - ema) * a + ema * b  # noqa: E731
    return MixtureParams(mix(old.mu_old, new.mu_old), mix(old.mu_new, new.mu_new), mix(old.sigma_old, new.sigma_old),
                         mix(old.sigma_new, new.sigma_new), mix(old.weight_new, new.weight_new))


def partition(e: torch.Tensor, params: MixtureParams) -> torch.Tensor:
    """Region [B] (int64: OLD, MIX, NEW) of energies e [B]: e < mu_old, mu_old <= e <= mu_new, e > mu_new. Every
    sample lands in exactly one region."""
    e = e.double()
    region = torch.full(e.shape, MIX, dtype=torch.int64)
    region[e < params.mu_old] = OLD
    region[e > params.mu_new] = NEW
    return region
