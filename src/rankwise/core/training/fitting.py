"""`fit`: the one small training loop for a loss that is a function of the step rather than of a task's examples —
a layer fitted to captured activations, an implicit neural representation fitted to its signal, a toy model on
batches it draws itself. Same guards as `train` (see `guard`): the schedule is a pure function of the step (from
`schedule`), optional clipping at a max norm, and a NaN / inf loss or gradient norm stops the run before the
optimizer sees it. No tasks, checkpoints, evaluation or DDP: what needs those trains with `train`.

    result = fit(model, lambda step: (model(x) - y).pow(2).mean(), steps=500,
                 optimizer=lambda params: torch.optim.Adam(params, lr=1e-3), max_grad_norm=1.0)

Each step: zero the gradients, `loss_at(step)`, check it is finite, backward, the gradient norm (clipped), check it
is finite, set the learning rate, `optimizer.step()`, `after_step(step)`. Everything random is the caller's
(`loss_at` draws its own batches), so a fit is as deterministic as its `loss_at`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from rankwise.core.progress import progress
from rankwise.core.training.guard import check_covers, grad_norm, nonfinite_error
from rankwise.errors import InvalidInputError

OptimizerMaker = Callable[[list[nn.Parameter]], torch.optim.Optimizer]  # (trainable parameters) -> optimizer
Schedule = Callable[[int], float]  # 0-based step -> learning rate (e.g. functools.partial of a `schedule` function)
NONFINITE = ("raise", "stop")


@dataclass
class FitResult:
    losses: list[float] = field(default_factory=list)  # per step done: the loss before its update
    grad_norms: list[float] = field(default_factory=list)  # per step done: the gradient norm before clipping
    optimizer: torch.optim.Optimizer | None = None  # the optimizer used, with its final state
    # with on_nonfinite="stop": what became non-finite and at which (1-based) step, e.g. "the loss became nan at
    # step 12"; the parameters are those after the last finite step. None when every step was done.
    diverged: str | None = None

    @property
    def steps(self) -> int:
        """Optimizer steps done."""
        return len(self.losses)


def fit(
    params: nn.Module | Iterable[nn.Parameter],
    loss_at: Callable[[int], torch.Tensor],
    steps: int,
    optimizer: torch.optim.Optimizer | OptimizerMaker,
    schedule: Schedule | None = None,
    max_grad_norm: float | None = None,
    after_step: Callable[[int], None] | None = None,
    on_nonfinite: Literal["raise", "stop"] = "raise",
    desc: str | None = None,
) -> FitResult:
    """Minimise `loss_at(step)` (a scalar tensor) over `steps` optimizer steps of the trainable `params`.

    `params`: a module (its parameters with requires_grad) or the parameters themselves. `optimizer`: an optimizer
    over them, or a function of the list of parameters that builds one; it must cover every one. `schedule(step)`
    sets every parameter group's learning rate before each step (None: the optimizer's own, untouched); a schedule
    needs the groups to share one learning rate. `max_grad_norm` clips the global gradient norm (None: no clipping).
    `after_step(step)` runs after each optimizer step (a projection, a renormalisation). The module's train / eval
    mode is the caller's.

    A non-finite loss or gradient norm at step k (1-based) stops the run before the optimizer step: with
    `on_nonfinite="raise"` (the loop's behaviour) a NumericalError naming the step and the last finite loss; with
    "stop" (a learning-rate sweep, where divergence is an outcome) the result so far, its `diverged` saying what
    happened. `desc` draws a progress bar with that label (None: none).
    """
    if steps < 1:
        raise InvalidInputError(f"steps must be at least 1, got {steps}")
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise InvalidInputError(f"max_grad_norm must be positive (or None: no clipping), got {max_grad_norm}")
    if on_nonfinite not in NONFINITE:
        raise InvalidInputError(f"on_nonfinite must be one of {list(NONFINITE)}, got {on_nonfinite!r}")
    named = _trainable(params)
    trained = list(named.values())
    if not trained:
        raise InvalidInputError("nothing to fit: no parameter requires a gradient")
    opt = optimizer if isinstance(optimizer, torch.optim.Optimizer) else optimizer(trained)
    check_covers(opt, named)
    if schedule is not None and len({group["lr"] for group in opt.param_groups}) > 1:
        raise InvalidInputError("fit's schedule sets one learning rate for every parameter group, but this optimizer's "
                                "groups have different ones (pass schedule=None to keep them)")
    result = FitResult(optimizer=opt)
    for step in progress(range(steps), desc=desc, total=steps) if desc is not None else range(steps):
        # Zeroed first, not after the step: whatever gradients the caller's parameters held do not leak into step 0.
        opt.zero_grad(set_to_none=True)
        loss = loss_at(step)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise InvalidInputError(f"loss_at must return a scalar tensor, got {got} at step {step + 1}")
        value = float(loss.detach())
        # Checked before backward (nothing is gained by differentiating a NaN), so the parameters stay those of the
        # last finite step.
        if not math.isfinite(value):
            return _stop(result, f"the loss became {value} at step {step + 1}", on_nonfinite, desc)
        loss.backward()
        norm = grad_norm(trained, max_grad_norm)
        if not math.isfinite(norm):
            opt.zero_grad(set_to_none=True)
            return _stop(result, f"the gradient norm became {norm} at step {step + 1}", on_nonfinite, desc)
        if schedule is not None:
            lr = schedule(step)
            for group in opt.param_groups:
                group["lr"] = lr
        opt.step()
        if after_step is not None:
            after_step(step)
        result.losses.append(value)
        result.grad_norms.append(norm)
    return result


def _trainable(params: nn.Module | Iterable[nn.Parameter]) -> dict[str, nn.Parameter]:
    """name -> parameter of what is trained, in the module's (or the iterable's) order; a parameter listed twice
    (tied weights) once."""
    if isinstance(params, nn.Module):
        return {n: p for n, p in params.named_parameters() if p.requires_grad}
    out: dict[str, nn.Parameter] = {}
    seen: set[int] = set()
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise InvalidInputError(f"fit takes a module or tensors to train, got a {type(p).__name__} at position {i}")
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out[f"parameter {i}"] = p
    return out


def _stop(result: FitResult, what: str, on_nonfinite: str, desc: str | None) -> FitResult:
    if on_nonfinite == "raise":
        raise nonfinite_error(desc or "fit", what, result.losses[-1] if result.losses else None)
    result.diverged = what
    return result
