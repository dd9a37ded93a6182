"""The card's truncated entropy, per observed coordinate: psi(v) = v log(v + 1) on [0, 1].

The FTRL regulariser at round t is (1/eta) sum_{u < t} psi(h(x_u)). log(v + 1) instead of log(v) keeps it finite
at v = 0 and uniformly strongly convex on [0, 1]: psi''(v) = 1/(v + 1) + 1/(v + 1)^2 >= 3/4.
"""

from __future__ import annotations

import numpy as np


def psi(v: np.ndarray) -> np.ndarray:
    """v log(v + 1), elementwise; in [0, log 2] on [0, 1]."""
    return v * np.log1p(v)


def psi_grad(v: np.ndarray) -> np.ndarray:
    """log(v + 1) + v / (v + 1)."""
    return np.log1p(v) + v / (1.0 + v)


def psi_hess(v: np.ndarray) -> np.ndarray:
    """1/(v + 1) + 1/(v + 1)^2 (the diagonal Hessian)."""
    inv = 1.0 / (1.0 + v)
    return inv + inv * inv
