"""Loss-curve collapse (Bergsma et al., ICLR 2026, "Scaling with Collapse"): normalised training-loss curves
l(t_hat) = L(t_hat T) / L(T), the AdamW timescale tau = B / (eta lambda D), an AdamW factory that holds tau fixed,
final-loss prediction from a prefix and the residual-from-collapse fault detector.
"""

from rankwise.recipes.loss_curve_collapse.curves import (
    Curve,
    collapse_spread,
    ema_smooth,
    grid,
    normalise,
    reference_curve,
    stack,
)
from rankwise.recipes.loss_curve_collapse.predict import (
    first_alarm,
    fit_divisor,
    fit_divisor_arrays,
    residual,
    rise_alarm,
)
from rankwise.recipes.loss_curve_collapse.timescale import (
    decay_matrices,
    timescale,
    timescale_adamw,
    timescale_in_steps,
    timescale_param_groups,
    weight_decay_for_timescale,
)

__all__ = [
    "Curve", "collapse_spread", "ema_smooth", "grid", "normalise", "reference_curve", "stack",
    "first_alarm", "fit_divisor", "fit_divisor_arrays", "residual", "rise_alarm",
    "decay_matrices", "timescale", "timescale_adamw", "timescale_in_steps", "timescale_param_groups",
    "weight_decay_for_timescale",
]
