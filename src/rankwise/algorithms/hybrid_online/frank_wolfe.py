"""Frank-Wolfe over conv(H) through the linear oracle: the FTRL step of the hybrid learner.

It minimises, over the values z = (h(x_1), ..., h(x_n)) of h in conv(H) on the observed points,

    F(z) = sum_u A_u z_u^2 + B_u z_u + lam * sum_u psi(z_u) + perturbation . z,      psi(v) = v log(v + 1),

which is the card's F_t (lam = 1/eta; lam = 0 gives follow-the-leader, a perturbation follow-the-perturbed-leader).
Each iteration: gradient c_u = dF/dz_u, s = oracle(X, c), exact line search on [z, s(X)] (F is separable, so the
search is a 1-D convex root find), z <- z + gamma (s(X) - z). The Frank-Wolfe gap g = c . (z - s(X)) bounds
F(z) - min F, so stopping at g <= tol certifies a tol-approximate minimiser.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwise.algorithms.hybrid_online.hypotheses import Mixture
from rankwise.algorithms.hybrid_online.oracles import LinearOracle, call_oracle
from rankwise.algorithms.hybrid_online.regularizer import psi, psi_grad


@dataclass
class FWResult:
    mixture: Mixture
    z: np.ndarray  # [n] the mixture's values on the points
    gap: float  # the last Frank-Wolfe gap (an upper bound on F(z) - min F)
    calls: int  # oracle calls made


def objective(z: np.ndarray, A: np.ndarray, B: np.ndarray, lam: float) -> float:
    """F(z) (B includes any perturbation)."""
    out = float(A @ (z * z) + B @ z)
    return out + lam * float(psi(z).sum()) if lam > 0 else out


def gradient(z: np.ndarray, A: np.ndarray, B: np.ndarray, lam: float) -> np.ndarray:
    g = 2.0 * A * z + B
    return g + lam * psi_grad(z) if lam > 0 else g


def _line_search(z: np.ndarray, d: np.ndarray, A: np.ndarray, B: np.ndarray, lam: float, gap: float) -> float:
    """argmin_{gamma in [0, 1]} F(z + gamma d) for convex separable F: safeguarded Newton on the derivative,
    started from the Newton step at 0 (F'(0) = -gap). z + gamma d stays in [0, 1] (a convex combination)."""
    dd = d * d
    twoA_d = 2.0 * A * d

    def deriv(g: float) -> tuple[float, float]:
        v = z + g * d
        first = float(twoA_d @ v + B @ d)
        second = float(twoA_d @ d)
        if lam > 0:
            inv = 1.0 / (1.0 + v)
            first += lam * float(d @ (np.log1p(v) + v * inv))
            second += lam * float(dd @ (inv + inv * inv))
        return first, second

    d1, _ = deriv(1.0)
    if d1 <= 0.0:
        return 1.0
    _, h0 = deriv(0.0)
    lo, hi = 0.0, 1.0
    g = gap / h0 if h0 > 0 and gap / h0 < 1.0 else 0.5
    for _ in range(60):
        f1, f2 = deriv(g)
        if f1 > 0:
            hi = g
        else:
            lo = g
        new = g - f1 / f2 if f2 > 0 else -1.0
        if not lo < new < hi:
            new = 0.5 * (lo + hi)
        if abs(new - g) < 1e-10:
            return new
        g = new
    return g


def frank_wolfe(oracle: LinearOracle, X: np.ndarray, A: np.ndarray, B: np.ndarray, lam: float, start: Mixture,
                z0: np.ndarray, tol: float, max_iter: int) -> FWResult:
    """Minimise F over conv(H) from `start` (whose values on X [n, d] are z0 [n]); at most `max_iter` oracle calls,
    stopping once the Frank-Wolfe gap is <= tol. A [n], B [n] as in the module docstring; lam >= 0."""
    mix, z = start.copy(), z0.copy()
    gap, calls = np.inf, 0
    for _ in range(max_iter):
        c = gradient(z, A, B, lam)
        s = call_oracle(oracle, X, c)
        calls += 1
        sv = np.asarray(s.predict(X), dtype=np.float64)
        d = sv - z
        gap = float(-(c @ d))
        if gap <= tol:
            break
        gamma = _line_search(z, d, A, B, lam, gap)
        if gamma <= 0.0:
            break
        z = np.clip(z + gamma * d, 0.0, 1.0) if gamma < 1.0 else sv
        mix.step_towards(s, gamma)
    return FWResult(mix, z, gap, calls)
