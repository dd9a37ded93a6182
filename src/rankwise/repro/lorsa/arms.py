"""What R1 and R2 share: fitting the two arms (Lorsa and the Top-K SAE) with one procedure, tuning their lr."""

from __future__ import annotations

from dataclasses import replace

import torch

from rankwise.core.arms import Selection, select_from_scores
from rankwise.errors import NumericalError
from rankwise.nn.lorsa import FitConfig, Lorsa, LorsaConfig, TopKSAE, fit, fvu

LORSA, SAE = "lorsa", "top-k SAE"


def build(arm: str, config: LorsaConfig, seed: int) -> torch.nn.Module:
    """A fresh arm of the same width (n_ov heads / latents) and K, initialised from `seed`."""
    torch.manual_seed(seed)
    return Lorsa(config) if arm == LORSA else TopKSAE(config.d_model, config.n_ov, config.k)


def fit_arm(arm: str, config: LorsaConfig, fit_config: FitConfig, x: torch.Tensor, y: torch.Tensor,
            seed: int) -> torch.nn.Module:
    """Fit one arm: Lorsa predicts Y from X, the SAE reconstructs Y from Y; same steps, batches and K schedule."""
    module = build(arm, config, seed)
    fit(module, x if arm == LORSA else y, y, replace(fit_config, seed=seed), desc=f"{arm} K={config.k}")
    return module.eval()


def arm_fvu(arm: str, module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return fvu(module, x if arm == LORSA else y, y)


def tune_lr(arm: str, config: LorsaConfig, fit_config: FitConfig, grid: tuple[float, ...], train: tuple, val: tuple,
            seed: int) -> Selection:
    """The lr with the lowest validation FVU after `fit_config.steps` steps (a diverged run scores inf)."""
    scores = []
    for lr in grid:
        try:
            m = fit_arm(arm, config, replace(fit_config, lr=lr), *train, seed=seed)
            scores.append(arm_fvu(arm, m, *val))
        except NumericalError:  # a diverged run: recorded, never chosen
            scores.append(float("inf"))
    return select_from_scores(grid, scores, higher_is_better=False, param="lr")
