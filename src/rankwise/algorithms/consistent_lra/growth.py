"""How fast cumulative recourse grows with the stream length: the fitted exponent of recourse against t.

Logarithmic growth R(t) = a log t has local exponent d log R / d log t = 1 / log t (about 0.1-0.15 for t in the
thousands); linear growth has exponent 1. The exponent is the least-squares slope of log R against log t over the
last `decades` decades of the stream (log-spaced points), where the early transient has passed.
"""

from __future__ import annotations

import numpy as np
import torch

from rankwise.errors import InvalidInputError


def growth_exponent(values: torch.Tensor | np.ndarray, *, decades: float = 1.0, points: int = 25) -> float:
    """Slope of log(values[t-1]) against log t over t in [n / 10^decades, n] (values: a cumulative curve [n]).

    Points where the curve is still 0 are left out; a curve that is 0 (or constant) there has exponent 0.
    """
    v = np.asarray(values.detach().cpu() if isinstance(values, torch.Tensor) else values, dtype=np.float64)
    if v.ndim != 1 or v.size < 2 or not np.all(np.isfinite(v)):
        raise InvalidInputError(f"values must be a finite 1-D curve of length >= 2, got shape {v.shape}")
    if decades <= 0 or points < 2:
        raise InvalidInputError(f"decades must be > 0 and points >= 2, got {decades}, {points}")
    n = v.size
    lo = max(1.0, n / 10.0**decades)
    t = np.unique(np.round(np.geomspace(lo, n, points)).astype(np.int64))
    y = v[t - 1]
    keep = y > 0
    if keep.sum() < 2:
        return 0.0
    return float(np.polyfit(np.log(t[keep]), np.log(y[keep]), 1)[0])
