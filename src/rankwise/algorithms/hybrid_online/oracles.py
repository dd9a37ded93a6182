"""Linear optimisation oracles for a class H: argmin_{h in H} sum_j c_j h(x_j).

Every oracle is called through `call_oracle`, which checks the input before the call and the answer after it, and
turns an oracle that raises, or answers with something that is not a hypothesis of [0, 1]-values, into `OracleError`.

- `FiniteClassOracle`: brute force over an explicit finite class (exact; O(|H| m) per call; the reference in tests).
- `StumpOracle`: exact over decision stumps (thresholds on a per-feature grid, both signs) by sorting into grid bins
  and prefix sums, O(m d + grid) per call; with d = 1 and sign +1 only it is the card's threshold class.
- `SklearnERMOracle`: the reduction to weighted classification, argmin sum_j c_j h(x_j) =
  sum_{c_j<0} c_j + argmin sum_j |c_j| 1{h(x_j) != 1{c_j < 0}}, handed to any scikit-learn classifier that takes
  `sample_weight` (default a depth-1 `DecisionTreeClassifier`). Trees minimise an impurity, not the weighted 0-1
  error, so this oracle is approximate; `oracle_excess` measures by how much.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rankwise.algorithms.hybrid_online.hypotheses import Constant, Stump, as_points, class_values
from rankwise.errors import InvalidInputError, RankwiseError


class OracleError(RankwiseError, RuntimeError):
    """The ERM / linear optimisation oracle raised or returned something that is not a [0, 1]-valued hypothesis."""


class LinearOracle:
    """Base class: `argmin(X [m, d], costs [m]) -> hypothesis`, and `default()`, some member of H (the decision
    before any data). `dim` is the point dimension d the oracle accepts (None: any)."""

    dim: int | None = None

    def argmin(self, X: np.ndarray, costs: np.ndarray):
        raise NotImplementedError

    def default(self):
        raise NotImplementedError


def check_costs(X: np.ndarray, costs: Any) -> np.ndarray:
    c = np.asarray(costs, dtype=np.float64)
    if c.ndim != 1 or c.shape[0] != X.shape[0]:
        raise InvalidInputError(f"costs must be [m] with m = {X.shape[0]} points, got shape {c.shape}")
    if not np.all(np.isfinite(c)):
        raise InvalidInputError("costs have NaN or Inf entries")
    return c


def call_oracle(oracle: LinearOracle, X: Any, costs: Any):
    """`oracle.argmin(X, costs)` with the input checked first and the answer checked after.

    X [m, d] (or [m] for d = 1), costs [m]. Raises InvalidInputError on bad input and OracleError when the oracle
    raises or its answer has no `predict`, gives the wrong shape, or leaves [0, 1].
    """
    x = as_points(X, getattr(oracle, "dim", None))
    c = check_costs(x, costs)
    try:
        h = oracle.argmin(x, c)
    except RankwiseError:
        raise
    except Exception as exc:  # any failure inside user or library code becomes one clear error
        raise OracleError(f"the oracle {type(oracle).__name__} raised {type(exc).__name__}: {exc}") from exc
    return check_hypothesis(h, x, f"the oracle {type(oracle).__name__}")


def check_hypothesis(h, X: np.ndarray, who: str):
    if not callable(getattr(h, "predict", None)):
        raise OracleError(f"{who} returned {type(h).__name__}, which has no predict(X)")
    try:
        v = np.asarray(h.predict(X[:1] if len(X) else X), dtype=np.float64)
    except Exception as exc:
        raise OracleError(f"{who} returned a hypothesis whose predict raised {type(exc).__name__}: {exc}") from exc
    if v.shape != (min(len(X), 1),) or not np.all((v >= 0) & (v <= 1)):
        raise OracleError(f"{who} returned a hypothesis whose predict gave {v!r}: expected [n] values in [0, 1]")
    return h


class FiniteClassOracle(LinearOracle):
    """Exact by brute force over `members` (each with predict and key)."""

    def __init__(self, members: Sequence, dim: int | None = None):
        if len(members) == 0:
            raise InvalidInputError("the hypothesis class is empty: give at least one member")
        self.members = list(members)
        self.dim = dim

    def argmin(self, X: np.ndarray, costs: np.ndarray):
        return self.members[int(np.argmin(class_values(self.members, X) @ costs))]

    def default(self):
        return self.members[0]


class StumpOracle(LinearOracle):
    """Exact over H = {Stump(f, theta, s) : f < d, theta in grids[f], s in signs}.

    grids: one sorted 1-D array of thresholds per feature. signs: (1,) for thresholds 1{x >= theta}, (1, -1) for
    stumps. Ties go to the smallest feature, then the smallest threshold, then sign +1.
    """

    def __init__(self, grids: Sequence[Any], signs: tuple[int, ...] = (1, -1)):
        if len(grids) == 0:
            raise InvalidInputError("StumpOracle needs one threshold grid per feature, got none")
        self.grids = []
        for f, g in enumerate(grids):
            a = np.asarray(g, dtype=np.float64)
            if a.ndim != 1 or a.size == 0:
                raise InvalidInputError(f"threshold grid of feature {f} is empty or not 1-D (shape {a.shape})")
            if np.any(np.isnan(a)) or np.any(np.diff(a) <= 0):
                raise InvalidInputError(f"threshold grid of feature {f} must be strictly increasing")
            self.grids.append(a)
        if not signs or any(s not in (1, -1) for s in signs):
            raise InvalidInputError(f"signs must be a non-empty subset of (1, -1), got {signs}")
        self.signs = tuple(signs)
        self.dim = len(self.grids)

    @property
    def size(self) -> int:
        return sum(g.size for g in self.grids) * len(self.signs)

    def members(self) -> list[Stump]:
        return [Stump(f, float(t), s) for f, g in enumerate(self.grids) for t in g for s in self.signs]

    def argmin(self, X: np.ndarray, costs: np.ndarray):
        best, best_h = np.inf, None
        total = float(costs.sum())
        for f, g in enumerate(self.grids):
            # bin b = number of thresholds <= x, so x >= g[k] iff k < b; S[k] = sum of costs with bin > k.
            b = np.searchsorted(g, X[:, f], side="right")
            per_bin = np.bincount(b, weights=costs, minlength=g.size + 1)
            above = total - np.cumsum(per_bin)[: g.size]
            for s in self.signs:
                obj = above if s > 0 else total - above
                k = int(np.argmin(obj))
                if obj[k] < best:
                    best, best_h = float(obj[k]), Stump(f, float(g[k]), s)
        return best_h

    def default(self):
        return Stump(0, float(self.grids[0][0]), self.signs[0])


class SklearnERMOracle(LinearOracle):
    """The linear oracle as weighted binary classification with a scikit-learn classifier (needs `sample_weight`).

    make_estimator: () -> a fresh classifier (default: DecisionTreeClassifier(max_depth=1, random_state=0)). A
    fitted depth-1 tree is returned as the equivalent `Stump` (fast, hashable, so mixtures merge repeats); other
    estimators are wrapped as they are.
    """

    def __init__(self, make_estimator: Callable[[], Any] | None = None, dim: int | None = None):
        if make_estimator is None:
            from sklearn.tree import DecisionTreeClassifier

            def make_estimator():
                return DecisionTreeClassifier(max_depth=1, random_state=0)
        self.make_estimator = make_estimator
        self.dim = dim

    def argmin(self, X: np.ndarray, costs: np.ndarray):
        y = (costs < 0).astype(np.int64)  # h(x_j) = 1 pays c_j: worth it exactly when c_j < 0
        w = np.abs(costs)
        if len(X) == 0 or w.sum() == 0 or y.min() == y.max():
            return Constant(float(y[0]) if len(y) and w.sum() > 0 else 0.0)
        est = self.make_estimator()
        est.fit(X, y, sample_weight=w)
        return _as_hypothesis(est)

    def default(self):
        return Constant(0.0)


class _Fitted:
    """A fitted scikit-learn classifier as a hypothesis: predict = the 0/1 class (no key: never merged)."""

    key = None

    def __init__(self, est):
        self.est = est

    def predict(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(self.est.predict(X), dtype=np.float64)


def _as_hypothesis(est):
    tree = getattr(est, "tree_", None)
    if tree is not None and tree.node_count == 3 and list(est.classes_) == [0, 1]:
        f, thr = int(tree.feature[0]), float(tree.threshold[0])
        left = int(np.argmax(tree.value[1][0]))  # class of x[f] <= thr
        right = int(np.argmax(tree.value[2][0]))
        if left == right:
            return Constant(float(left))
        # sklearn sends x <= thr left; 1{x > thr} = 1{x >= next float above thr}
        theta = float(np.nextafter(thr, np.inf))
        return Stump(f, theta, 1 if right == 1 else -1)
    if tree is not None and tree.node_count == 1:
        return Constant(float(est.classes_[int(np.argmax(tree.value[0][0]))]))
    return _Fitted(est)


def linear_objective(h, X: np.ndarray, costs: np.ndarray) -> float:
    """sum_j costs[j] h(x_j)."""
    return float(np.asarray(h.predict(X), dtype=np.float64) @ costs)


def oracle_excess(approx: LinearOracle, exact: LinearOracle, X: Any, costs: Any) -> float:
    """How much worse the approximate oracle's answer is than the exact one's, in units of sum |c| (>= 0 up to
    rounding when `exact` is exact over a class containing the approximate oracle's)."""
    x = as_points(X)
    c = check_costs(x, costs)
    a = linear_objective(call_oracle(approx, x, c), x, c)
    e = linear_objective(call_oracle(exact, x, c), x, c)
    return (a - e) / max(float(np.abs(c).sum()), 1e-300)
