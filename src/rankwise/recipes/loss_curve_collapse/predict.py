"""Uses of a collapsed reference curve l_ref: predicting a run's final loss from a prefix, and the residual from
collapse as an early fault detector.

- `fit_divisor`: c_hat = argmin_c sum_{t_hat <= p} (L(t_hat) / c - l_ref(t_hat))^2 = sum L^2 / sum L l_ref, the final
  loss that best aligns the prefix with the reference (exact for a scaled copy of l_ref).
- `residual`: rho(t_hat) = L(t_hat) / c - l_ref(t_hat), with c fixed (e.g. fitted on an early window, or the
  scaling-law prediction), so a fault after the fit shows up as rho leaving the seed-to-seed band.
- `first_alarm`: the first t_hat in a window where |rho| exceeds a declared band.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rankwise.errors import InvalidInputError, NumericalError
from rankwise.recipes.loss_curve_collapse.curves import Curve, _finite_1d, same_length


def fit_divisor_arrays(losses: Sequence[float] | np.ndarray, reference: Sequence[float] | np.ndarray) -> float:
    """c_hat = sum L^2 / sum L * l_ref over paired points: losses [n] and reference values [n] at the same t_hat."""
    y = _finite_1d(losses, "losses")
    r = _finite_1d(reference, "reference")
    same_length(y, r, "losses", "reference")
    denom = float(np.dot(y, r))
    if not denom > 0:
        raise InvalidInputError("the losses and the reference must be positive to fit a divisor (sum L * l_ref <= 0)")
    return float(np.dot(y, y)) / denom


def fit_divisor(curve: Curve, reference: Curve, upto: float = 1.0, start: float = 0.0) -> float:
    """The final loss predicted from `curve`'s points with start < t_hat <= upto, aligned to `reference` (a
    normalised curve, l_ref(1) = 1); l_ref is interpolated at the curve's own t_hat, so the lengths may differ."""
    if not 0 <= start < upto <= 1:
        raise InvalidInputError(f"need 0 <= start < upto <= 1, got start {start}, upto {upto}")
    keep = (curve.t_hat > start) & (curve.t_hat <= upto)
    if not keep.any():
        raise InvalidInputError(f"no point of the curve lies in t_hat ({start}, {upto}]")
    return fit_divisor_arrays(curve.loss[keep], reference.at(curve.t_hat[keep]))


def residual(curve: Curve, reference: Curve, divisor: float) -> Curve:
    """rho(t_hat) = L(t_hat) / divisor - l_ref(t_hat) at the curve's points (a Curve whose `loss` is rho)."""
    if not (divisor > 0 and math.isfinite(divisor)):
        raise InvalidInputError(f"the divisor (a predicted final loss) must be positive and finite, got {divisor}")
    return Curve(curve.t_hat, curve.loss / divisor - reference.at(curve.t_hat))


def first_alarm(rho: Curve, band: float, lo: float = 0.0, hi: float = 1.0, two_sided: bool = True) -> float | None:
    """The first t_hat in [lo, hi] where |rho| > band (rho > band if not two-sided); None if it never happens."""
    if not (band > 0 and math.isfinite(band)):
        raise InvalidInputError(f"the band must be positive and finite, got {band}")
    t, r = rho.t_hat, rho.loss
    hit = (t >= lo) & (t <= hi) & ((np.abs(r) if two_sided else r) > band)
    idx = np.flatnonzero(hit)
    return float(t[idx[0]]) if idx.size else None


def rise_alarm(curve: Curve, band: float, lo: float = 0.0, hi: float = 1.0) -> float | None:
    """The raw-loss rule a person watching the curve applies: the first t_hat in [lo, hi] where the (smoothed) loss
    is more than `band` (relative) above its running minimum so far; None if it never happens."""
    if not (band > 0 and math.isfinite(band)):
        raise InvalidInputError(f"the band must be positive and finite, got {band}")
    if np.any(curve.loss <= 0):
        raise NumericalError("a relative rise needs positive losses")
    running_min = np.minimum.accumulate(curve.loss)
    hit = (curve.t_hat >= lo) & (curve.t_hat <= hi) & (curve.loss / running_min - 1 > band)
    idx = np.flatnonzero(hit)
    return float(curve.t_hat[idx[0]]) if idx.size else None
