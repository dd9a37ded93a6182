"""How both LMAO experiments choose every arm's rates on validation, and summarise the chosen arms' results: LoRA, MeZO and full FT each on its own grid (a
choice on an edge extends the grid by a half-decade, up to `max_extend` times); LMAO by coordinates, eta_W on its
grid at LoRA's chosen eta_BA, then eta_BA over LoRA's choice and its half-decade neighbours at the chosen eta_W."""

from __future__ import annotations

import statistics as stats
from collections.abc import Callable, Mapping

from rankwise.core.arms import half_decade_neighbour, select_with_extension
from rankwise.core.report import Report
from rankwise.repro.lmao.arms import FULL_FT, LMAO, LORA, MEZO


def tune_arms(report: Report, grids: Mapping[str, tuple[float, ...]], validate: Callable[..., float],
              max_extend: int, steps: int, batch: int) -> dict[str, tuple[float, float]]:
    """{arm: (lr, eta_W)} chosen by `validate(arm, lr, eta_W=0.0)` (higher is better); each choice recorded as an
    arm of `report` with the same budget, and the budgets checked equal."""
    chosen: dict[str, tuple[float, float]] = {}
    budget = {"steps": steps, "batch": batch, "examples_seen": steps * batch}
    for arm in (LORA, MEZO, FULL_FT):
        sel = select_with_extension(grids[arm], lambda lr, arm=arm: validate(arm, lr), True, "lr", max_extend)
        chosen[arm] = (sel.chosen, 0.0)
        report.record_arm(arm, sel, budget=budget)
    lora_lr = chosen[LORA][0]
    sel_w = select_with_extension(grids[LMAO], lambda w: validate(LMAO, lora_lr, w), True, "eta_W", max_extend)
    report.record_arm(LMAO, sel_w, budget=budget)
    ba_grid = (half_decade_neighbour(lora_lr, up=False), lora_lr, half_decade_neighbour(lora_lr, up=True))
    sel_ba = select_with_extension(ba_grid, lambda lr: validate(LMAO, lr, sel_w.chosen), True, "eta_BA", max_extend)
    report.record_arm(f"{LMAO} (eta_BA at eta_W={sel_w.chosen:g})", sel_ba, budget=budget)
    chosen[LMAO] = (sel_ba.chosen, sel_w.chosen)
    report.check_budgets_matched(["steps", "batch", "examples_seen"])
    return chosen


def add_summary(report: Report, title: str, results: Mapping[str, list[float]],
                chosen: Mapping[str, tuple[float, float]]) -> None:
    """A table of each arm's chosen rates and the mean and sd of its per-seed accuracies (points)."""
    summary = report.table(title, ["arm", "lr", "eta_W", "mean", "sd", "seeds"])
    for arm, v in results.items():
        summary.add(arm=arm, lr=chosen[arm][0], eta_W=chosen[arm][1] if arm == LMAO else "", mean=stats.mean(v),
                    sd=stats.stdev(v) if len(v) > 1 else 0.0, seeds=len(v))
