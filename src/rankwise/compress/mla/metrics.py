"""Per-layer relative activation error of a conversion: ||X (W - W_hat)||_F / ||X W||_F for K and for V.

Computed from a second moment C of the inputs X by the trace identity (1/N sum ||X_b D||^2 = trace(D^T C D)), so
evaluating it on held-out text needs one calibration-style pass, not a forward per method.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from rankwise.compress.mla.convert import MLAPlan
from rankwise.compress.mla.layout import dense_kv_weights, kv_layout
from rankwise.core.calibration import SecondMoment
from rankwise.core.linalg import relative_activation_error
from rankwise.errors import InvalidInputError


@dataclass(frozen=True)
class LayerError:
    layer: int
    k: float  # relative activation error of K
    v: float  # relative activation error of V


def activation_errors(original: nn.Module, plan: MLAPlan, moments: Sequence[SecondMoment]) -> list[LayerError]:
    """Relative activation errors of `plan`'s factors against `original`'s dense K/V, under moments (one per layer)."""
    layout = kv_layout(original)
    if len(moments) != layout.num_layers or len(plan.factors) != layout.num_layers:
        raise InvalidInputError(f"need one moment and one factor pair per layer ({layout.num_layers})")
    errors = []
    for i, ((k, v), moment) in enumerate(zip(plan.factors, moments)):
        c = moment.covariance()
        w_k, w_v = dense_kv_weights(original, i)
        errors.append(LayerError(i, relative_activation_error(w_k, k.product(), c), relative_activation_error(w_v, v.product(), c)))
    return errors
