"""Learning-rate schedule: linear warmup, then a decay to a floor — cosine (the default), linear (to zero with
min_lr_ratio 0: "linear-to-zero", which loss-curve studies prefer) or constant. A pure function of the step, so a
resumed run needs no scheduler state."""

from __future__ import annotations

import math

from rankwise.errors import InvalidInputError

DECAYS = ("cosine", "linear", "constant")


def lr_at(step: int, total_steps: int, peak_lr: float, warmup_steps: int, min_lr_ratio: float = 0.0,
          decay: str = "cosine") -> float:
    """The learning rate for optimizer step `step` (0-based) of `total_steps`.

    Warmup: peak * (step + 1) / warmup for step < warmup. Then `decay` from peak down to peak * min_lr_ratio at the
    last step: a half cosine, a straight line, or none (constant at peak).
    """
    if decay not in DECAYS:
        raise InvalidInputError(f"unknown learning-rate decay {decay!r}; known: {list(DECAYS)}")
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps - 1)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    floor = peak_lr * min_lr_ratio
    if decay == "constant":
        return peak_lr
    shape = 1.0 - progress if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + (peak_lr - floor) * shape
