"""Full-batch gradient descent on the MSE of a bias-free ReLU net, logging per-layer spectra (card E2).

From small initialisation the loss sits on a plateau at C(0) and then drops when theta escapes the origin saddle.
On the plateau the gradient is tiny (~||theta||^(L-1)), so the step is rescaled by a scalar that depends on theta; any
such scalar is a time change of gradient flow, so with small enough steps the *path* (what the spectra measure) is
the flow's. Rules for the learning rate lr_t, all capped at `lr_max`:

- "relative": lr_t = eta ||theta_t|| / ||grad C(theta_t)||: every step moves theta by a fraction eta of its norm,
  whatever the init scale (used by the reproduction for small and standard init alike);
- "norm_power": lr_t = eta / ||theta_t||^(L-2), the paper's rule (10 / ||theta||^4 for L = 6 on MNIST);
- "constant": lr_t = eta.

The escape step is the first step whose loss is at most (1 - escape_drop) C(0), C(0) = ||Y*||_F^2 / (2N).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rankwise.algorithms.escape_directions.network import check_weights, mse_loss, parameter_norm
from rankwise.algorithms.escape_directions.spectra import singular_values
from rankwise.core.progress import progress
from rankwise.errors import InvalidInputError, NumericalError

RULES = ("relative", "norm_power", "constant")


@dataclass
class Trajectory:
    """What one training run recorded.

    losses: C(theta_t) at every step t = 0..steps (before each update, the last after it); norms: ||theta_t||.
    logged_steps / spectra: every `log_every` steps, the top-k singular values [k] of each layer (spectra[i][l]).
    escape_step: the first step with loss <= (1 - escape_drop) C(0) (None: no escape within the run), with the
    weights at that step; final_weights after the last step.
    """

    losses: list[float] = field(default_factory=list)
    norms: list[float] = field(default_factory=list)
    logged_steps: list[int] = field(default_factory=list)
    spectra: list[list[torch.Tensor]] = field(default_factory=list)
    escape_step: int | None = None
    escape_weights: list[torch.Tensor] | None = None
    final_weights: list[torch.Tensor] = field(default_factory=list)
    zero_loss: float = math.nan


def train_from_init(x: torch.Tensor, y_star: torch.Tensor, weights: Sequence[torch.Tensor], steps: int,
                    eta: float, lr_max: float = math.inf, rule: str = "relative", log_every: int = 10, top_k: int = 5,
                    escape_drop: float = 0.02, steps_after_escape: int | None = None, desc: str = "GD",
                    relu: bool = True) -> Trajectory:
    """Full-batch GD on C = ||Y_theta - Y*||^2 / (2N) from `weights` (copied); x [d_0, N], y_star [d_L, N].

    Stops after `steps` updates, or `steps_after_escape` updates after the escape step when that is set.
    `relu=False` trains the deep linear net of the same widths (the baseline whose layers all stay balanced).
    """
    if rule not in RULES:
        raise InvalidInputError(f"rule must be one of {RULES}, got {rule!r}")
    if steps < 1 or log_every < 1 or not (0 < escape_drop < 1) or eta <= 0:
        raise InvalidInputError(f"need steps >= 1, log_every >= 1, 0 < escape_drop < 1, eta > 0; got {steps}, "
                                f"{log_every}, {escape_drop}, {eta}")
    ws = [w.detach().clone().requires_grad_(True) for w in check_weights(weights, x)]
    depth = len(ws)
    traj = Trajectory(zero_loss=float((y_star.double() ** 2).sum() / (2 * y_star.shape[1])))
    threshold = (1 - escape_drop) * traj.zero_loss
    stop_at = steps
    for t in progress(range(steps + 1), desc=desc):
        loss = mse_loss(ws, x, y_star, relu)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise NumericalError(f"loss became {value} at step {t}; lower eta ({eta}) or lr_max ({lr_max})")
        traj.losses.append(value)
        with torch.no_grad():
            traj.norms.append(float(parameter_norm(ws)))
        if t % log_every == 0 or t == stop_at:
            traj.logged_steps.append(t)
            traj.spectra.append([singular_values(w, top_k) for w in ws])
        if traj.escape_step is None and value <= threshold:
            traj.escape_step = t
            traj.escape_weights = [w.detach().clone() for w in ws]
            if steps_after_escape is not None:
                stop_at = min(steps, t + steps_after_escape)
        if t >= stop_at:
            break
        grads = torch.autograd.grad(loss, ws)
        with torch.no_grad():
            lr = _learning_rate(rule, eta, lr_max, depth, traj.norms[-1], grads)
            for w, gr in zip(ws, grads):
                w -= lr * gr
    traj.final_weights = [w.detach().clone() for w in ws]
    return traj


def _learning_rate(rule: str, eta: float, lr_max: float, depth: int, norm: float, grads) -> float:
    if rule == "constant":
        lr = eta
    elif rule == "norm_power":
        lr = eta / norm ** (depth - 2)
    else:
        gnorm = math.sqrt(sum(float((g * g).sum()) for g in grads))
        lr = eta * norm / gnorm if gnorm > 0 else lr_max
    return min(lr, lr_max)


def balance(weights: Sequence[torch.Tensor]) -> list[float]:
    """||W_{l+1}||_F^2 - ||W_l||_F^2 for l = 1..L-1: conserved by gradient flow of a bias-free ReLU net."""
    sq = [float((w.double() ** 2).sum()) for w in check_weights(weights)]
    return [b - a for a, b in zip(sq[:-1], sq[1:])]
