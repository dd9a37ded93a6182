"""Learning-rate schedule: linear warmup, then cosine decay to a floor. A pure function of the step, so a resumed
run needs no scheduler state."""

from __future__ import annotations

import math


def lr_at(step: int, total_steps: int, peak_lr: float, warmup_steps: int, min_lr_ratio: float = 0.0) -> float:
    """The learning rate for optimizer step `step` (0-based) of `total_steps`.

    Warmup: peak * (step + 1) / warmup for step < warmup. Then cosine from peak down to peak * min_lr_ratio at the
    last step.
    """
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps - 1)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    floor = peak_lr * min_lr_ratio
    return floor + (peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
