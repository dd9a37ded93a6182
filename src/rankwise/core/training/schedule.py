"""Learning-rate schedules, each a pure function of the step (so a resumed run needs no scheduler state); the one
module every loop takes its schedule from.

`lr_at` is the loop's: linear warmup, then a decay to a floor — cosine (the default), linear (to zero with
min_lr_ratio 0: "linear-to-zero", which loss-curve studies prefer) or constant (`DECAYS` names them). Two other shapes
are used by `fit`'s callers: `warmup_stable_decay` (warmup, a plateau, a linear decay over the last steps: Lorsa's
fits) and `warmup_times_cosine` (a cosine over the whole run to a floor, multiplied by a warmup ramp: MoM's runs).
"""

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
        return _warmup(step, peak_lr, warmup_steps)
    decay_steps = max(1, total_steps - warmup_steps - 1)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    floor = peak_lr * min_lr_ratio
    if decay == "constant":
        return peak_lr
    shape = 1.0 - progress if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + (peak_lr - floor) * shape


def warmup_stable_decay(step: int, total_steps: int, peak_lr: float, warmup_steps: int, decay_steps: int,
                        final_lr_ratio: float = 0.0) -> float:
    """Warmup-stable-decay: the linear warmup of `lr_at` over the first `warmup_steps` (>= 1), then `peak_lr`, then over
    the last `decay_steps` (0: none) a straight line that reaches peak * final_lr_ratio at the last step.

    The decay's i-th step (1-based) is at peak * (1 - i / decay_steps * (1 - final_lr_ratio)): its first step is
    already below the peak. Warmup wins where the two overlap.
    """
    if step < warmup_steps:
        return _warmup(step, peak_lr, warmup_steps)
    if decay_steps and step >= total_steps - decay_steps:
        frac = (step - (total_steps - decay_steps) + 1) / decay_steps
        return peak_lr * (1 - frac * (1 - final_lr_ratio))
    return peak_lr


def warmup_times_cosine(step: int, total_steps: int, peak_lr: float, warmup_steps: int, floor_ratio: float) -> float:
    """peak * min(1, (step + 1) / warmup) * (floor + (1 - floor) / 2 * (1 + cos(pi * min(1, step / total)))).

    Unlike `lr_at`, the half cosine spans the whole run from step 0 (it never quite reaches the floor: at the last
    step it is cos(pi * (total - 1) / total)) and the warmup ramp multiplies it instead of preceding it. Evaluated in
    exactly this order, so it equals `torch.optim.lr_scheduler.LambdaLR` over that lambda bit for bit (with (1 - floor) / 2
    written as the float it rounds to: 0.45 for floor 0.1)."""
    ramp = min(1.0, (step + 1) / warmup_steps)
    return peak_lr * (ramp * (floor_ratio + (1.0 - floor_ratio) / 2 * (1 + math.cos(math.pi * min(1.0, step / total_steps)))))


def _warmup(step: int, peak_lr: float, warmup_steps: int) -> float:
    """The linear warmup every schedule here starts with: peak * (step + 1) / warmup, reaching the peak at step
    warmup - 1."""
    return peak_lr * (step + 1) / warmup_steps
