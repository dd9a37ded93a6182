"""Fair arms: each arm's hyperparameter chosen on a validation split, and the budgets it ran under.

A comparison is only fair when every arm (the method and each baseline) was tuned the same way and ran under the same
budget. `select_on_validation` picks an arm's value from a grid and flags a choice on the grid's edge: the grid may
not bracket that arm's optimum, so a baseline could look worse only because its grid stopped too early. A 1-point
grid is flagged as not tuned. `Arm` records the choice with the arm's budget (parameters, steps, tokens, ...), and
`budgets_matched` tells, without raising, whether named budget entries are equal across arms.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any

from rankwise.errors import InvalidInputError, NumericalError


def _is_number(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


@dataclass(frozen=True)
class Selection:
    """The value chosen from `grid` by validation `scores` (one per grid point; non-finite means the run failed)."""

    grid: tuple[Any, ...]
    scores: tuple[float, ...]
    chosen_index: int
    higher_is_better: bool
    param: str = ""

    @property
    def chosen(self) -> Any:
        return self.grid[self.chosen_index]

    @property
    def chosen_score(self) -> float:
        return self.scores[self.chosen_index]

    @property
    def tuned(self) -> bool:
        return len(self.grid) >= 2

    @property
    def edge(self) -> str | None:
        """"low" / "high" when the choice is the grid's smallest / largest value (first / last point for a grid of
        non-numbers), None when it is interior or the grid has a single point."""
        if not self.tuned:
            return None
        if all(_is_number(g) for g in self.grid):
            # By value, so an unsorted numeric grid is still judged by what it spans.
            values = [float(g) for g in self.grid]
            c = values[self.chosen_index]
            return "low" if c == min(values) else "high" if c == max(values) else None
        return "low" if self.chosen_index == 0 else "high" if self.chosen_index == len(self.grid) - 1 else None

    @property
    def on_edge(self) -> bool:
        return self.edge is not None

    @property
    def flag(self) -> str | None:
        """What a reader must be warned about, or None."""
        if not self.tuned:
            return "not tuned (1-point grid)"
        if self.edge:
            return f"choice on the grid's {self.edge} edge: the grid may not bracket the optimum"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"param": self.param, "chosen": self.chosen, "chosen_score": self.chosen_score, "grid": list(self.grid),
                "scores": list(self.scores), "higher_is_better": self.higher_is_better, "tuned": self.tuned,
                "on_edge": self.on_edge, "flag": self.flag}


def select_from_scores(grid: Sequence[Any], scores: Sequence[float], higher_is_better: bool, param: str = "") -> Selection:
    """Choose the grid value with the best validation score (the first such value on a tie).

    A non-finite score (a diverged run) is kept in the record but never chosen; if every score is non-finite there
    is nothing to choose and `NumericalError` is raised.
    """
    grid, scores = tuple(grid), tuple(float(s) for s in scores)
    if not grid:
        raise InvalidInputError("the grid is empty: give at least one value to choose from")
    if len(scores) != len(grid):
        raise InvalidInputError(f"{len(grid)} grid values but {len(scores)} scores; give one score per grid value")
    if all(_is_number(g) for g in grid) and len({float(g) for g in grid}) != len(grid):
        raise InvalidInputError(f"the grid has repeated values: {list(grid)}")
    finite = [i for i, s in enumerate(scores) if math.isfinite(s)]
    if not finite:
        raise NumericalError(f"every validation score is non-finite ({list(scores)}): no grid value can be chosen; "
                             "widen the grid toward stabler values")
    sign = 1.0 if higher_is_better else -1.0
    best = max(finite, key=lambda i: (sign * scores[i], -i))  # -i: the first of equal scores wins
    return Selection(grid, scores, best, bool(higher_is_better), param)


def select_on_validation(grid: Sequence[Any], score: Callable[[Any], float], higher_is_better: bool,
                         param: str = "") -> Selection:
    """Score every grid value with `score` (a validation metric, never the test split) and choose the best one."""
    grid = tuple(grid)
    return select_from_scores(grid, [score(g) for g in grid], higher_is_better, param)


@dataclass(frozen=True)
class Arm:
    """One arm of a comparison: its tuned choice and the budget it ran under (free-form numbers)."""

    name: str
    selection: Selection
    budget: Mapping[str, float]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidInputError(f"an arm needs a non-empty name, got {self.name!r}")
        if not isinstance(self.selection, Selection):
            raise InvalidInputError(f"arm {self.name!r}: selection must come from select_on_validation / "
                                    f"select_from_scores, got {type(self.selection).__name__}")
        clean: dict[str, float] = {}
        for key, value in dict(self.budget).items():
            value = value.item() if hasattr(value, "item") else value  # numpy / torch scalars
            if not _is_number(value) or not math.isfinite(value):
                raise InvalidInputError(f"arm {self.name!r}: budget {key!r} must be a finite number, got {value!r}")
            clean[str(key)] = value
        object.__setattr__(self, "budget", clean)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.selection.to_dict(), "budget": dict(self.budget)}


def budgets_matched(arms: Sequence[Arm], keys: Sequence[str], rel_tol: float = 0.0) -> dict[str, bool]:
    """Per key: is the budget entry present in every arm and equal across arms within `rel_tol` (relative)?"""
    if rel_tol < 0 or not math.isfinite(rel_tol):
        raise InvalidInputError(f"rel_tol must be finite and >= 0, got {rel_tol}")
    out: dict[str, bool] = {}
    for key in keys:
        values = [a.budget.get(key) for a in arms]
        if len(arms) < 2 or any(v is None for v in values):
            out[key] = False  # nothing to compare, or an arm that did not record it: not shown to be matched
            continue
        lo, hi = min(values), max(values)
        out[key] = (hi - lo) <= rel_tol * max(abs(lo), abs(hi))
    return out


# Half-decade steps (1, 3, 10, 30, ...): where a flagged grid is extended by default.
HALF_DECADES = tuple(m * 10.0 ** k for k in range(-12, 3) for m in (1.0, 3.0))


def half_decade_neighbour(value: float, up: bool) -> float:
    """The half-decade step next to `value` (the nearest step's neighbour above or below; clamped at the ends)."""
    if not (value > 0 and math.isfinite(value)):
        raise InvalidInputError(f"a grid extended by half-decades needs positive values, got {value!r}")
    i = min(range(len(HALF_DECADES)), key=lambda k: abs(math.log(HALF_DECADES[k] / value)))
    return HALF_DECADES[min(i + 1, len(HALF_DECADES) - 1)] if up else HALF_DECADES[max(i - 1, 0)]


def grid_step_neighbour(grid: Sequence[float]) -> Callable[[float, bool], float]:
    """For `select_with_extension`: the value beyond an edge at the grid's own geometric step (grid[1] / grid[0] of
    the sorted grid; 3 for a one-point grid), e.g. 1e-4 below a grid 3e-4, 1e-3, 3e-3 ... ."""
    values = sorted(grid)
    ratio = values[1] / values[0] if len(values) > 1 else 3.0
    return lambda value, up: value * ratio if up else value / ratio


def select_with_extension(grid: Sequence[float], score: Callable[[float], float], higher_is_better: bool,
                          param: str = "", max_extend: int = 1,
                          neighbour: Callable[[float, bool], float] = half_decade_neighbour) -> Selection:
    """The protocol's "extend a flagged grid": score every grid value; while the choice sits on an edge, score the
    value beyond that edge (`neighbour(edge_value, up)`), at most `max_extend` times. Returns the selection over
    every value scored (still flagged if the last extension left the choice on an edge)."""
    scores = {v: score(v) for v in grid}
    for _ in range(max_extend):
        values = sorted(scores)
        sel = select_from_scores(values, [scores[v] for v in values], higher_is_better, param)
        if sel.edge is None:
            break
        new = neighbour(values[0], False) if sel.edge == "low" else neighbour(values[-1], True)
        if new in scores:
            break
        scores[new] = score(new)
    values = sorted(scores)
    return select_from_scores(values, [scores[v] for v in values], higher_is_better, param)


@dataclass
class Tuned:
    """What `tune_then_seeds` returns: the selection, every tuning run by value, and one run per seed at the choice
    (the first seed's is the tuning run itself)."""

    selection: Selection
    runs: dict[float, Any]
    seed_runs: list[Any]

    @property
    def chosen(self) -> float:
        return float(self.selection.chosen)


def tune_then_seeds(grid: Sequence[float], run: Callable[[float, int], Any], seeds: Sequence[int],
                    score: Callable[[Any], float], higher_is_better: bool, param: str = "lr", max_extend: int = 1,
                    label: str = "", score_name: str = "validation score") -> Tuned:
    """The protocol's arm tuning: run every grid value on `seeds[0]` and score each run on validation (the grid
    extended at its own step off an edge, `select_with_extension` + `grid_step_neighbour`); the seed-`seeds[0]` run
    at the chosen value is that seed's run (it was trained exactly so), and the other seeds are run at the choice.
    `run(value, seed)` trains one arm; `score(result)` reads its validation score."""
    from rankwise.core.progress import say

    if not seeds:
        raise InvalidInputError("tune_then_seeds needs at least one seed")
    runs: dict[float, Any] = {}

    def tuning_score(value: float) -> float:
        runs[value] = run(value, seeds[0])
        got = score(runs[value])
        say(f"{label}: {param} {value:.3g} -> {score_name} {got:.4f}")
        return got

    selection = select_with_extension(grid, tuning_score, higher_is_better=higher_is_better, param=param,
                                      max_extend=max_extend, neighbour=grid_step_neighbour(grid))
    chosen = float(selection.chosen)
    return Tuned(selection, runs, [runs[chosen]] + [run(chosen, s) for s in seeds[1:]])
