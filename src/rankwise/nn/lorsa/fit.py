"""Fitting a replacement (Lorsa, or the SAE baseline) to captured activations, and the fidelity metric FVU.

Data: inputs X and targets Y [N, seq, d] (for Lorsa X = the attention input after the pre-norm, Y = the output after
o_proj; for the SAE X = Y). Both are rescaled so that their mean token norm is sqrt(d); the scales live in the
module's `input_scale` / `output_scale` buffers, so the fitted module maps raw activations to raw outputs. The loss
is the MSE in the normalised space over every position but the first `skip_first` (BOS / attention sink). Adam
without weight decay, gradient clipping at 1.0, a warmup-stable-decay learning rate, a K annealing warmup and,
optionally, the auxiliary loss on dead units (`auxk`), on the one fitting loop (`rankwise.core.training.fitting`:
its NaN guard, clipping and schedule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from rankwise.core.training.fitting import fit as train_fit
from rankwise.core.training.schedule import warmup_stable_decay
from rankwise.errors import InvalidInputError, NumericalError
from rankwise.nn.lorsa.auxk import DeadUnits, aux_loss
from rankwise.nn.lorsa.checks import check_sequence
from rankwise.nn.lorsa.topk import top_k


@dataclass(frozen=True)
class FitConfig:
    """steps of Adam at `lr` on `batch_size` sequences; K anneals linearly from `k_start` (None: no annealing) to
    the module's K over the first `k_warmup` fraction of steps; the lr warms up over `warmup`, decays linearly to
    `final_lr_ratio * lr` over the last `decay` fraction."""

    steps: int
    lr: float
    batch_size: int = 16
    warmup: float = 0.05
    decay: float = 0.2
    final_lr_ratio: float = 0.01
    k_start: int | None = None
    k_warmup: float = 0.1
    grad_clip: float = 1.0
    skip_first: int = 1
    seed: int = 0
    # The auxiliary loss on dead units (`auxk`): 0 = off; else each token's top `aux_k` dead units fit the residual,
    # weighted by `aux_coef`; a unit is dead after `dead_steps` steps unselected.
    aux_k: int = 0
    aux_coef: float = 1.0 / 32.0
    dead_steps: int = 10

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or not (math.isfinite(self.lr) and self.lr > 0):
            raise InvalidInputError(f"steps and batch_size must be >= 1 and lr > 0, got {self.steps}, {self.batch_size}, {self.lr}")
        if self.skip_first < 0:
            raise InvalidInputError(f"skip_first must be >= 0, got {self.skip_first}")
        if self.aux_k < 0 or self.dead_steps < 1 or not (math.isfinite(self.aux_coef) and self.aux_coef >= 0):
            raise InvalidInputError(f"aux_k must be >= 0, dead_steps >= 1 and aux_coef a finite number >= 0, got "
                                    f"{self.aux_k}, {self.dead_steps}, {self.aux_coef}")

    def lr_at(self, step: int) -> float:
        return warmup_stable_decay(step, self.steps, self.lr, max(1, round(self.warmup * self.steps)),
                                   round(self.decay * self.steps), self.final_lr_ratio)

    def k_at(self, step: int, k: int) -> int:
        if self.k_start is None:
            return k
        n = max(1, round(self.k_warmup * self.steps))
        return k if step >= n else int(round(self.k_start + (k - self.k_start) * step / n))


@dataclass
class FitResult:
    losses: list[float] = field(default_factory=list)  # normalised MSE per step (the auxiliary term excluded)
    dead_fraction: float = 0.0  # units unselected over the last `dead_steps` steps, at the end of the fit


def mean_token_norm(t: torch.Tensor, skip_first: int = 1) -> float:
    """Mean L2 norm of the tokens of t [N, seq, d] after the first `skip_first` positions."""
    return float(t[:, skip_first:].double().norm(dim=-1).mean())


def set_scales_(module: nn.Module, x: torch.Tensor, y: torch.Tensor, skip_first: int = 1) -> None:
    """Set `input_scale` / `output_scale` so that X and Y have mean token norm sqrt(d) inside the module."""
    d = x.size(-1)
    for name, t in (("input_scale", x), ("output_scale", y)):
        norm = mean_token_norm(t, skip_first)
        if not norm > 0:
            raise NumericalError(f"the {name.split('_')[0]} activations are all zero: nothing to fit")
        getattr(module, name).fill_(math.sqrt(d) / norm)


@torch.no_grad()
def init_output_(module: nn.Module, x: torch.Tensor, y: torch.Tensor, skip_first: int = 1) -> None:
    """b_O = mean of Y (normalised), then W_V, b_V scaled so the output deviation matches Y's on one batch.

    The authors also scale W_Q, W_K; scaling only the values matches the norms exactly (the top-K ranking is
    invariant to a common scale) without sharpening the initial patterns. Lorsa only; the SAE needs none.
    """
    ys = y[:, skip_first:] * module.output_scale
    module.b_O.copy_(ys.reshape(-1, ys.size(-1)).mean(0))
    pred = module(x)[:, skip_first:] * module.output_scale
    ratio = (ys - module.b_O).norm(dim=-1).mean() / (pred - module.b_O).norm(dim=-1).mean().clamp_min(1e-12)
    module.W_V.mul_(ratio)
    module.b_V.mul_(ratio)


def fit(module: nn.Module, x: torch.Tensor, y: torch.Tensor, config: FitConfig, desc: str = "fit") -> FitResult:
    """Train `module` (a Lorsa or a TopKSAE: its `codes`, `decode` and `readout`) to map x [N, seq, d_in] to
    y [N, seq, d], in place. The result's losses are the main MSE per step, without the auxiliary term."""
    check_sequence(x, x.size(-1) if x.dim() == 3 else -1, "inputs")
    check_sequence(y, y.size(-1) if y.dim() == 3 else -1, "targets")
    if x.shape[:2] != y.shape[:2]:
        raise InvalidInputError(f"inputs {tuple(x.shape)} and targets {tuple(y.shape)} must share [N, seq]")
    if y.size(1) <= config.skip_first:
        raise InvalidInputError(f"sequences of {y.size(1)} tokens leave nothing after skipping {config.skip_first}")
    k_final = module.config.k if hasattr(module, "config") else module.k
    gen = torch.Generator().manual_seed(config.seed)
    set_scales_(module, x, y, config.skip_first)
    if hasattr(module, "b_O"):
        init_output_(module, x[: config.batch_size], y[: config.batch_size], config.skip_first)
    s = config.skip_first
    n_units = module.config.n_ov if hasattr(module, "config") else module.n_latents
    dead = DeadUnits(n_units, config.dead_steps)
    mses: list[float] = []

    def loss_at(step: int) -> torch.Tensor:
        rows = torch.randint(0, x.size(0), (config.batch_size,), generator=gen)
        scores, values = module.codes(x[rows])
        vals, idx = top_k(scores, values, config.k_at(step, k_final))
        # The loss in normalised units, so lr and clipping mean the same at any activation scale.
        residual = (y[rows, s:] - module.decode(vals, idx)[:, s:]).mul(module.output_scale)  # e = y - y_hat
        mse = residual.pow(2).sum(-1).mean()
        mses.append(float(mse.detach()))
        dead.update(idx[:, s:])
        if config.aux_k == 0 or config.aux_coef == 0:
            return mse
        aux = aux_loss(scores[:, s:], values[:, s:], dead.mask(), residual.detach(), config.aux_k, module.readout)
        return mse + config.aux_coef * aux

    renormalise = getattr(module, "after_step", None)  # the SAE keeps unit decoder rows
    train_fit(module, loss_at, config.steps, lambda params: torch.optim.Adam(params, lr=config.lr, weight_decay=0.0),
              schedule=config.lr_at, max_grad_norm=config.grad_clip,
              after_step=(lambda _: renormalise()) if renormalise is not None else None, desc=desc)
    return FitResult(losses=mses, dead_fraction=float(dead.mask().double().mean()))


@torch.no_grad()
def fvu(module: nn.Module, x: torch.Tensor, y: torch.Tensor, skip_first: int = 1, batch_size: int = 32) -> float:
    """Fraction of variance unexplained sum ||y_hat - y||^2 / sum ||y - mean(y)||^2 over positions >= skip_first."""
    if x.shape[:2] != y.shape[:2]:
        raise InvalidInputError(f"inputs {tuple(x.shape)} and targets {tuple(y.shape)} must share [N, seq]")
    err, total = 0.0, 0.0
    yv = y[:, skip_first:].double()
    mean = yv.reshape(-1, y.size(-1)).mean(0)
    for i in range(0, x.size(0), batch_size):
        pred = module(x[i:i + batch_size])[:, skip_first:].double()
        err += float((pred - yv[i:i + batch_size]).pow(2).sum())
        total += float((yv[i:i + batch_size] - mean).pow(2).sum())
    return err / total
