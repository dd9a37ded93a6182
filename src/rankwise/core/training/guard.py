"""What every optimizer step of `train` and `fit` checks, in one place so both guard alike: the optimizer covers every
trainable parameter, the gradient norm (clipped when asked), and the NumericalError a non-finite loss or gradient
norm stops a run with."""

from __future__ import annotations

import torch
from torch import nn

from rankwise.errors import InvalidInputError, NumericalError


def check_covers(opt: torch.optim.Optimizer, params: dict[str, nn.Parameter]) -> None:
    """Refuse an optimizer that leaves one of `params` (name -> parameter) out: it would silently never train."""
    covered = {id(p) for group in opt.param_groups for p in group["params"]}
    missing = [n for n, p in params.items() if id(p) not in covered]
    if missing:
        raise InvalidInputError(
            f"the optimizer does not update {len(missing)} trainable parameter(s), e.g. {missing[:3]}: its factory must "
            "cover every parameter with requires_grad (freeze the others first)"
        )


def grad_norm(params: list[nn.Parameter], max_norm: float | None) -> float:
    """The global L2 norm of the gradients of `params` (those that have one), before clipping; with `max_norm`, the
    gradients are clipped to it in place (`torch.nn.utils.clip_grad_norm_`). 0.0 when no parameter has a gradient."""
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return 0.0
    if max_norm is None:
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in grads])))
    return float(torch.nn.utils.clip_grad_norm_(grads, max_norm))


def nonfinite_error(subject: str, what: str, last_loss: float | None, note: str | None = None) -> NumericalError:
    """The error that stops a run whose loss or gradient norm became non-finite, e.g. "training stopped: the loss
    became nan at step 12; the last finite loss was 2.31; <note>. Try a lower learning rate or gradient clipping."
    (`what` names the value and the 1-based step; `note` says what was kept)."""
    last = f"; the last finite loss was {last_loss:.4g}" if last_loss is not None else ""
    kept = f"; {note}" if note else ""
    return NumericalError(f"{subject} stopped: {what}{last}{kept}. Try a lower learning rate or gradient clipping.")
