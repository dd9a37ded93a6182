"""What the LRNN experiments share: full-batch Adam fitting, per-arm learning-rate tuning on validation, PSNR.

An arm is a named `build(seed) -> nn.Module`; an experiment supplies the training loss and the validation score of a
fitted model. Every arm is tuned the same way (one tuning seed, the same grid procedure, the same steps) and then
refitted over the evaluation seeds with its chosen learning rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rankwise.core.arms import Selection, select_with_extension
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.core.training import fit as train_fit

TUNING_SEED_OFFSET = 10_000  # the tuning fits use seeds no evaluation fit uses


@dataclass(frozen=True)
class Arm:
    """One model family of a comparison: `build(seed)` returns a fresh model (same architecture every seed)."""

    name: str
    build: Callable[[int], nn.Module]
    # this arm's learning-rate grid when it differs from the comparison's shared one: every arm is tuned by the
    # same procedure, but each grid must bracket that arm's own optimum (a product net wants larger steps than SIREN)
    lr_grid: Sequence[float] | None = None


@dataclass
class Fit:
    model: nn.Module
    final_loss: float
    diverged: bool
    losses: list[float]


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def fit(model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor], steps: int, lr: float,
        log_every: int = 50) -> Fit:
    """Adam at a constant `lr` for `steps` full-batch steps on `loss_fn(model)` (`core.training.fit`, no clipping);
    stops at the first non-finite loss (or gradient), a diverged fit. `losses` holds every `log_every`-th step's loss,
    then the loss after the last step."""
    run = train_fit(model, lambda _: loss_fn(model), steps, lambda params: torch.optim.Adam(params, lr=lr),
                    on_nonfinite="stop")
    losses = run.losses[::log_every]
    if run.diverged is not None:
        return Fit(model, math.nan, True, losses)
    with torch.no_grad():
        loss_v = float(loss_fn(model))
    losses.append(loss_v)
    return Fit(model, loss_v, not math.isfinite(loss_v), losses)


def tune_arm(report: Report, arm: Arm, grid: Sequence[float], run: Callable[[nn.Module, float], Fit],
             val_score: Callable[[nn.Module], float], seed: int, budget: dict[str, float],
             higher_is_better: bool = True, extend: int = 0) -> float:
    """Fit `arm` once per learning rate of `grid` (tuning seed), score each on validation, record and return the
    choice; while the choice sits on an edge, the grid is extended half a decade beyond it, at most `extend` times."""

    def score_at(lr: float) -> float:
        torch.manual_seed(seed + TUNING_SEED_OFFSET)
        res = run(arm.build(seed + TUNING_SEED_OFFSET), lr)
        score = val_score(res.model) if not res.diverged else math.nan
        say(f"tune {arm.name}: lr {lr:g} -> validation {score:.4g}")
        return score if math.isfinite(score) else (-math.inf if higher_is_better else math.inf)

    sel: Selection = select_with_extension(list(grid), score_at, higher_is_better, param="lr", max_extend=extend)
    report.record_arm(arm.name, sel, budget=budget)
    return float(sel.chosen)


def psnr(pred: torch.Tensor, target: torch.Tensor, peak: float = 1.0) -> float:
    """PSNR in dB on a [0, peak] signal, computed in float64 (the card: fp32 PSNRs saturate near 100 dB)."""
    mse = float(((pred.detach().double() - target.double()) ** 2).mean())
    return 10.0 * math.log10(peak**2 / mse) if mse > 0 else math.inf


def grid_coords(n: int) -> torch.Tensor:
    """[n * n, 2] pixel-centre coordinates in [-1, 1]^2, row-major (y = row, x = column)."""
    t = torch.linspace(-1.0, 1.0, n)
    yy, xx = torch.meshgrid(t, t, indexing="ij")
    return torch.stack((yy.flatten(), xx.flatten()), dim=-1)


def held_out_mask(count: int, fraction: float, seed: int) -> torch.Tensor:
    """[count] bool, True for a random `fraction` of the entries (the validation split), fixed by `seed`."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(count, dtype=bool)
    mask[rng.choice(count, size=max(1, int(round(fraction * count))), replace=False)] = True
    return torch.from_numpy(mask)


def matched_width(target: int, count: Callable[[int], int], lo: int = 2, hi: int = 4096) -> int:
    """The width w whose `count(w)` is closest to `target` (count increasing in w)."""
    return min(range(lo, hi + 1), key=lambda w: abs(count(w) - target))


def compare_arms(report: Report, arm_list: Sequence[Arm], grid: Sequence[float], train: Callable[[nn.Module, float], Fit],
                 val_score: Callable[[nn.Module], float], evaluate: Callable[[Fit], dict[str, float]], seeds: int,
                 seed: int, budget: Callable[[Arm], dict[str, float]], higher_is_better: bool = True,
                 extend: int = 0) -> tuple[dict[str, float], dict[str, dict[str, list[float]]]]:
    """Tune every arm's learning rate on validation (same grid, same procedure; `extend` as in `tune_arm`), then fit
    it over `seeds` seeds.

    Returns ({arm: chosen lr}, {arm: {metric: per-seed values}}) with the metrics `evaluate` computes per fit.
    """
    chosen = {a.name: tune_arm(report, a, a.lr_grid or grid, train, val_score, seed, budget(a), higher_is_better,
                               extend) for a in arm_list}
    results: dict[str, dict[str, list[float]]] = {a.name: {} for a in arm_list}
    for i in range(seeds):
        for arm in arm_list:
            say(f"seed {i + 1}/{seeds}: {arm.name} at lr {chosen[arm.name]:g}")
            torch.manual_seed(seed + i)
            metrics = evaluate(train(arm.build(seed + i), chosen[arm.name]))
            for k, v in metrics.items():
                results[arm.name].setdefault(k, []).append(float(v))
    return chosen, results
