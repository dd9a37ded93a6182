"""The AdamW timescale tau = B / (eta * lambda * D) = 1 / (eta * lambda * T) and an AdamW whose decay follows it.

PyTorch's AdamW shrinks every decayed weight by (1 - lr * weight_decay) per step, an EMA over updates with memory
1 / (eta * lambda) steps; tau is that memory as a fraction of the T training steps. Holding tau fixed while the
peak learning rate, the run length or the width changes means setting lambda = 1 / (eta * tau * T) for each
parameter group (its own learning rate eta_g), which `timescale_param_groups` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rankwise.errors import InvalidInputError

LrRatio = Callable[[str, nn.Parameter], float]  # (name, parameter) -> its learning rate / the peak learning rate
Decayed = Callable[[str, nn.Parameter], bool]  # (name, parameter) -> does weight decay apply to it


def _positive(value: float, what: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{what} must be a number, got {value!r}") from None
    if not (v > 0 and math.isfinite(v)):
        hint = " (with no weight decay the AdamW timescale is infinite)" if what.startswith("weight") and v == 0 else ""
        raise InvalidInputError(f"{what} must be positive and finite, got {v}{hint}")
    return v


def timescale(batch_tokens: float, lr: float, weight_decay: float, total_tokens: float) -> float:
    """tau = B / (eta * lambda * D): the AdamW EMA memory as a fraction of training (B tokens per step, D in all)."""
    b, eta = _positive(batch_tokens, "batch_tokens"), _positive(lr, "lr")
    lam, d = _positive(weight_decay, "weight_decay"), _positive(total_tokens, "total_tokens")
    if d < b:
        raise InvalidInputError(f"total_tokens ({d}) must be at least one batch ({b})")
    return b / (eta * lam * d)


def timescale_in_steps(lr: float, weight_decay: float, steps: int) -> float:
    """tau = 1 / (eta * lambda * T), the same quantity counted in optimizer steps."""
    return 1.0 / (_positive(lr, "lr") * _positive(weight_decay, "weight_decay") * _positive(steps, "steps"))


def weight_decay_for_timescale(tau: float, lr: float, steps: int) -> float:
    """lambda = 1 / (eta * tau * T): the decoupled weight decay that gives timescale `tau` over `steps` steps."""
    return 1.0 / (_positive(tau, "tau") * _positive(lr, "lr") * _positive(steps, "steps"))


def decay_matrices(name: str, p: nn.Parameter) -> bool:
    """The default decay rule: weight matrices and embeddings (>= 2-D) decay, gains and biases do not."""
    return p.dim() >= 2


def timescale_param_groups(module: nn.Module, lr: float, steps: int, tau: float | None = None,
                           weight_decay: float | None = None, lr_ratio: LrRatio | None = None,
                           decayed: Decayed = decay_matrices) -> list[dict[str, Any]]:
    """AdamW parameter groups over the trainable parameters, one per (learning-rate ratio, decayed).

    Exactly one of `tau` (every decayed group gets lambda_g = 1 / (lr * ratio_g * tau * steps), so all share the
    timescale) and `weight_decay` (every decayed group gets that lambda, so the timescale varies with ratio_g, lr and
    steps). `lr_ratio` gives a parameter's learning rate relative to `lr` (e.g. muP's base_width / width for hidden
    matrices; default 1). Each group records its `tau` (inf for undecayed groups).
    """
    if (tau is None) == (weight_decay is None):
        raise InvalidInputError("give exactly one of tau (hold the timescale fixed) and weight_decay (hold lambda fixed)")
    lr, steps = _positive(lr, "lr"), int(_positive(steps, "steps"))
    if tau is not None:
        tau = _positive(tau, "tau")
    else:
        weight_decay = _positive(weight_decay, "weight_decay")
    groups: dict[tuple[float, bool], list[nn.Parameter]] = {}
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        ratio = 1.0 if lr_ratio is None else _positive(lr_ratio(name, p), f"lr_ratio of {name}")
        groups.setdefault((ratio, bool(decayed(name, p))), []).append(p)
    if not groups:
        raise InvalidInputError("the module has no trainable parameters")
    out = []
    for (ratio, dec), params in groups.items():
        eta = lr * ratio
        if not dec:
            lam, group_tau = 0.0, math.inf
        elif tau is not None:
            lam, group_tau = weight_decay_for_timescale(tau, eta, steps), tau
        else:
            lam, group_tau = float(weight_decay), timescale_in_steps(eta, weight_decay, steps)
        out.append({"params": params, "lr": eta, "weight_decay": lam, "tau": group_tau})
    return out


def timescale_adamw(tau: float | None = None, weight_decay: float | None = None, lr_ratio: LrRatio | None = None,
                    decayed: Decayed = decay_matrices, betas: tuple[float, float] = (0.9, 0.95),
                    optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW):
    """An optimizer factory `(module, config) -> AdamW` for `rankwise.training.train`: the groups of
    `timescale_param_groups` at `config.lr` over `config.steps` (the schedule scales each group's lr by its ratio,
    so the timescale is defined at the peak learning rate, as in the paper). `optimizer_class` takes (groups, lr,
    betas), e.g. an AdamW subclass that injects a fault.
    """
    if (tau is None) == (weight_decay is None):
        raise InvalidInputError("give exactly one of tau (hold the timescale fixed) and weight_decay (hold lambda fixed)")
    _positive(tau if tau is not None else weight_decay, "tau" if tau is not None else "weight_decay")

    def make(module: nn.Module, config) -> torch.optim.Optimizer:
        groups = timescale_param_groups(module, config.lr, config.steps, tau, weight_decay, lr_ratio, decayed)
        return optimizer_class(groups, lr=config.lr, betas=betas)

    what = f"tau={tau!r}" if tau is not None else f"weight_decay={weight_decay!r}"
    make.label = f"timescale-adamw({what}, betas={betas!r}, {optimizer_class.__name__})"  # type: ignore[attr-defined]
    return make
