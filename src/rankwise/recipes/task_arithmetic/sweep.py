"""The lambda sweep and its selection on validation data.

    points = lambda_sweep(base_state, vectors, lambdas, evaluate)     # theta_0 + lam * sum tau at each lam
    best = select_point(points, min_accuracy)                          # the fairest point that is accurate enough

`evaluate(state)` scores a merged state on a validation split and returns an object with `accuracy` and `gap`
(`metrics.FairnessMetrics`: gap = (DPD + EOD) / 2). The paper picks lambda on validation "by a joint accuracy and
fairness criterion" without writing it down; the reading here is a constrained one: among the points whose
validation accuracy reaches `min_accuracy` (e.g. the FFT model's validation accuracy minus a declared margin), the
one with the smallest gap; if none does, the most accurate. A weighted sum of accuracy and gap was rejected: a
constant predictor has DPD = EOD = 0 and would win it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rankwise.errors import InvalidInputError
from rankwise.recipes.task_arithmetic.merging import scale_sum
from rankwise.recipes.task_arithmetic.vectors import StateLike, TaskVector, as_state, check_coefficient


class Scored(Protocol):
    accuracy: float

    @property
    def gap(self) -> float: ...


@dataclass(frozen=True)
class SweepPoint:
    lam: float
    metrics: Any  # what `evaluate` returned (a Scored)


def lambda_sweep(base: StateLike, vectors: Sequence[TaskVector], lambdas: Sequence[float],
                 evaluate: Callable[[dict[str, torch.Tensor]], Any]) -> list[SweepPoint]:
    """evaluate(theta_0 + lam * sum_g tau_g) for each lam (the sum parametrisation), in the given order."""
    lambdas = [check_coefficient(x, f"lambda {i}") for i, x in enumerate(lambdas)]
    if not lambdas or len(set(lambdas)) != len(lambdas):
        raise InvalidInputError(f"the lambda grid must be non-empty without repeats, got {lambdas}")
    vectors = list(vectors)
    state = as_state(base)
    scale_sum(state, vectors, 0.0)  # validates vectors against the state before any evaluation
    return [SweepPoint(lam, evaluate(scale_sum(state, vectors, lam))) for lam in lambdas]


def constrained_score(accuracy: float, gap: float, min_accuracy: float) -> float:
    """One number that orders points as `select_point` does (higher is better): 1 - gap in [0, 1] when accuracy >=
    min_accuracy, accuracy - 2 (< 0, below every feasible point) otherwise."""
    for what, v in (("accuracy", accuracy), ("gap", gap), ("min_accuracy", min_accuracy)):
        if not math.isfinite(v):
            raise InvalidInputError(f"{what} must be finite, got {v}")
    return 1.0 - gap if accuracy >= min_accuracy else accuracy - 2.0


def select_point(points: Sequence[SweepPoint], min_accuracy: float) -> SweepPoint:
    """The point of largest `constrained_score` (the first of equal ones)."""
    if not points:
        raise InvalidInputError("no sweep points to select from")
    scores = [constrained_score(p.metrics.accuracy, p.metrics.gap, min_accuracy) for p in points]
    return points[max(range(len(points)), key=lambda i: (scores[i], -i))]
