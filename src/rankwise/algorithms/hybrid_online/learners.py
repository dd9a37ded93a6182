"""Oracle-efficient online learners for the hybrid protocol (x_t i.i.d., labels r_t from a constrained class).

All three minimise, at round t over conv(H), the card's empirical objective on the observed points x_1..x_{t-1}

    sum_{s=2}^{t-1} l~_s(v),    l~_s(v) = 1/(s-1) sum_{u<s} l(v(x_u), r_s(x_u))

(the loss of round s averaged over the samples seen *before* r_s was chosen), aggregated into per-point quadratic
coefficients A_u, B_u, and differ only in what is added to it:

- `HybridFTRL` (the paper): + (1/eta) sum_u psi(v(x_u)), psi(v) = v log(v + 1), eta = sqrt(T / (L^2 log T)) by
  default, solved by Frank-Wolfe to a gap of tol = 1/(25 eta) (so the card's 5 L sqrt(eta eps T) term is <= L sqrt T).
- `FollowTheLeader`: nothing (eta = infinity).
- `FollowPerturbedLeader`: + sum_u xi_u v(x_u), xi_u ~ N(0, scale^2) drawn afresh each round (a perturbation on the
  observed points, in the spirit of Wu et al. 2024's hallucinated samples; the decision is the perturbed leader).

Use: `h = learner.decide()` (a Mixture, the decision h_t), the adversary picks r_t, x_t is drawn, then
`learner.observe(x_t, r_t)` with r_t the whole label function (anything with predict).
"""

from __future__ import annotations

import math

import numpy as np

from rankwise.algorithms.hybrid_online.frank_wolfe import frank_wolfe
from rankwise.algorithms.hybrid_online.hypotheses import Mixture, as_points
from rankwise.algorithms.hybrid_online.losses import Loss, get_loss
from rankwise.algorithms.hybrid_online.oracles import LinearOracle, OracleError, call_oracle, check_hypothesis
from rankwise.errors import InvalidInputError


def default_eta(horizon: int, lipschitz: float) -> float:
    """The card's eta = sqrt(T / (L^2 log T)) (from T log2/eta + (4/3) eta L^2 log T), T >= 2."""
    return math.sqrt(horizon / (lipschitz ** 2 * math.log(horizon)))


class EmpiricalLearner:
    """Shared machinery: the observed points, the per-point coefficients and the warm-started Frank-Wolfe step.

    oracle: the linear optimisation oracle for H. loss: "absolute" or "squared" (or a Loss). horizon: T >= 2.
    lam: regulariser weight (1/eta; 0 = none). tol: Frank-Wolfe gap at which a round stops. max_iter: oracle calls
    per round at most.
    """

    name = "empirical"

    def __init__(self, oracle: LinearOracle, loss: str | Loss, horizon: int, lam: float, tol: float, max_iter: int):
        if not isinstance(oracle, LinearOracle):
            raise InvalidInputError(f"oracle must be a LinearOracle, got {type(oracle).__name__}")
        if not isinstance(horizon, int) or horizon < 2:
            raise InvalidInputError(f"horizon must be an int >= 2, got {horizon!r}")
        if not (lam >= 0 and math.isfinite(lam)) or not tol >= 0 or not (isinstance(max_iter, int) and max_iter >= 1):
            raise InvalidInputError(f"need lam >= 0 finite, tol >= 0, max_iter >= 1; got {lam}, {tol}, {max_iter}")
        self.oracle, self.loss, self.horizon = oracle, get_loss(loss), horizon
        self.lam, self.tol, self.max_iter = float(lam), float(tol), max_iter
        self.dim: int | None = getattr(oracle, "dim", None)
        self.n = 0
        self._X = np.zeros((0, self.dim or 0))
        self._A = np.zeros(0)
        self._B = np.zeros(0)
        self._z = np.zeros(0)
        self._mix: Mixture | None = None
        self.calls: list[int] = []  # oracle calls per round
        self.gaps: list[float] = []  # Frank-Wolfe gap at the end of each round

    # --- the decision ------------------------------------------------------------------------------------------

    def _extra_linear(self) -> np.ndarray | None:
        return None

    def decide(self) -> Mixture:
        """h_t in conv(H), from x_1..x_{t-1} and r_1..r_{t-1} only."""
        if self._mix is None:
            try:
                h0 = self.oracle.default()
            except Exception as exc:
                raise OracleError(f"the oracle {type(self.oracle).__name__}.default() raised "
                                  f"{type(exc).__name__}: {exc}") from exc
            self._mix = Mixture.of(check_hypothesis(h0, np.zeros((1, self.dim or 1)), "oracle.default()"))
        if self.n == 0:
            self.calls.append(0)
            self.gaps.append(0.0)
            return self._mix.copy()
        X, A, B = self._X[: self.n], self._A[: self.n], self._B[: self.n]
        extra = self._extra_linear()
        res = frank_wolfe(self.oracle, X, A, B if extra is None else B + extra, self.lam, self._mix,
                          self._z[: self.n], self.tol, self.max_iter)
        self._mix = res.mixture
        self._z[: self.n] = res.z
        self.calls.append(res.calls)
        self.gaps.append(res.gap)
        return self._mix.copy()

    # --- the feedback ------------------------------------------------------------------------------------------

    def observe(self, x, r) -> None:
        """Round t's point x_t [d] and label function r_t: r_t's loss on x_1..x_{t-1} (weight 1/(t-1)) joins the
        objective; x_t becomes a coordinate (its own loss term only comes from later rounds)."""
        x = as_points(np.reshape(np.asarray(x, dtype=np.float64), (1, -1)), self.dim, "x_t")
        if self._mix is None:
            raise InvalidInputError("observe() before decide(): call decide() for round t first")
        if not callable(getattr(r, "predict", None)):
            raise InvalidInputError(f"r_t must be a label function with predict(X), got {type(r).__name__}")
        if self.dim is None:
            self.dim = x.shape[1]
            self._X = np.zeros((0, self.dim))
        if self.n > 0:
            y = self.loss.check_labels(r.predict(self._X[: self.n]))
            a, b, _ = self.loss.coefficients(y)
            w = 1.0 / self.n
            self._A[: self.n] += w * a
            self._B[: self.n] += w * b
        self._grow()
        self._X[self.n] = x[0]
        self._A[self.n] = self._B[self.n] = 0.0
        self._z[self.n] = float(self._mix.predict(x)[0])
        self.n += 1

    def _grow(self) -> None:
        if self.n < len(self._A):
            return
        cap = max(2 * len(self._A), self.horizon, 8)
        d = self._X.shape[1]
        self._X = np.concatenate([self._X, np.zeros((cap - len(self._X), d))])
        self._A, self._B, self._z = (np.concatenate([v, np.zeros(cap - len(v))]) for v in (self._A, self._B, self._z))

    @property
    def points(self) -> np.ndarray:
        """x_1..x_n [n, d] observed so far."""
        return self._X[: self.n].copy()

    def empirical_objective(self, values: np.ndarray) -> float:
        """The unregularised empirical objective (up to its constant) at a decision's values on the points [n]."""
        return float(self._A[: self.n] @ (values * values) + self._B[: self.n] @ values)


class HybridFTRL(EmpiricalLearner):
    """The paper's learner: FTRL with the truncated entropy over conv(H), Frank-Wolfe through the linear oracle.

    eta: None = the card's sqrt(T / (L^2 log T)) times `eta_scale`; math.inf = follow-the-leader. tol: None =
    1/(25 eta). max_iter: the Frank-Wolfe budget per round (oracle calls), default 50.
    """

    name = "hybrid-ftrl"

    def __init__(self, oracle: LinearOracle, loss: str | Loss = "absolute", horizon: int = 1000,
                 eta: float | None = None, eta_scale: float = 1.0, tol: float | None = None, max_iter: int = 50):
        if not (isinstance(horizon, int) and horizon >= 2):
            raise InvalidInputError(f"horizon must be an int >= 2, got {horizon!r}")
        if eta is None:
            if not (eta_scale > 0 and math.isfinite(eta_scale)):
                raise InvalidInputError(f"eta_scale must be positive and finite, got {eta_scale}")
            eta = eta_scale * default_eta(horizon, get_loss(loss).lipschitz)
        if not eta > 0:
            raise InvalidInputError(f"eta must be positive (math.inf for follow-the-leader), got {eta}")
        self.eta = float(eta)
        lam = 0.0 if math.isinf(eta) else 1.0 / eta
        super().__init__(oracle, loss, horizon, lam, lam / 25.0 if tol is None else tol, max_iter)


class FollowTheLeader(EmpiricalLearner):
    """The same objective without a regulariser (the card's FTL / ERM baseline). For the absolute loss it is one
    linear problem, so Frank-Wolfe ends on the oracle's vertex; tol = 1e-9 stops it there."""

    name = "ftl"

    def __init__(self, oracle: LinearOracle, loss: str | Loss = "absolute", horizon: int = 1000, tol: float = 1e-9,
                 max_iter: int = 50):
        super().__init__(oracle, loss, horizon, 0.0, tol, max_iter)


class FollowPerturbedLeader(EmpiricalLearner):
    """The same objective plus fresh Gaussian linear perturbations on the observed points; the decision is the
    uniform mixture of `samples` perturbed leaders (one oracle call each for the absolute loss, a Frank-Wolfe solve
    each for the squared loss), i.e. a Monte-Carlo estimate of FTPL's expected play, so that an adaptive adversary
    that sees h_t sees the learner's distribution, not its coin flips.

    scale: the perturbation's standard deviation per point. samples: perturbed leaders per round. seed: the stream.
    """

    name = "ftpl"

    def __init__(self, oracle: LinearOracle, loss: str | Loss = "absolute", horizon: int = 1000, scale: float = 1.0,
                 samples: int = 50, seed: int = 0, tol: float = 1e-9, max_iter: int = 50):
        if not (scale >= 0 and math.isfinite(scale)):
            raise InvalidInputError(f"scale must be >= 0 and finite, got {scale}")
        if not isinstance(samples, int) or samples < 1:
            raise InvalidInputError(f"samples must be a positive int, got {samples!r}")
        super().__init__(oracle, loss, horizon, 0.0, tol, max_iter)
        self.scale, self.samples = float(scale), samples
        self._rng = np.random.default_rng(seed)

    def decide(self) -> Mixture:
        if self._mix is None or self.n == 0:
            return super().decide()
        X, A, B = self._X[: self.n], self._A[: self.n], self._B[: self.n]
        acc: dict = {}  # key -> [hypothesis, weight]: repeated leaders merge
        calls = 0
        for _ in range(self.samples):
            Bk = B + self.scale * self._rng.standard_normal(self.n)
            if not A.any():  # linear objective: the perturbed leader is the oracle's vertex
                lead, c = Mixture.of(call_oracle(self.oracle, X, Bk)), 1
            else:
                start = Mixture.of(self._mix.components[0])
                res = frank_wolfe(self.oracle, X, A, Bk, 0.0, start, start.predict(X), self.tol, self.max_iter)
                lead, c = res.mixture, res.calls
            calls += c
            for h, w in zip(lead.components, lead.weights):
                key = h.key if getattr(h, "key", None) is not None else id(h)
                acc.setdefault(key, [h, 0.0])[1] += w / self.samples
        mix = Mixture([h for h, _ in acc.values()], [w for _, w in acc.values()])
        self._mix = mix
        self._z[: self.n] = mix.predict(X)
        self.calls.append(calls)
        self.gaps.append(float("nan"))
        return mix.copy()

