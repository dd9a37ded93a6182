"""Escape directions of the origin saddle: fixed points of the spherical gradient flow of L_0.

Writing theta = ||theta|| * theta_bar, the direction follows the projected gradient flow of L_0 on the sphere. An
*escape direction* is a point rho with ||rho||^2 = L and grad L_0(rho) = -s rho, s > 0; by Euler's identity
<grad L_0(rho), rho> = L * L_0(rho), its *escape speed* is s = -L_0(rho). The *optimal* escape direction minimises
L_0 on that sphere (radius sqrt(L): balanced layers with ||W_l||_F = 1 each, as small-init gradient flow keeps
||W_{l+1}||_F^2 - ||W_l||_F^2 fixed). It is found here by projected gradient descent with restarts (card E1):
theta <- theta - eta grad L_0(theta), then rescale to norm sqrt(L); the best speed over restarts is kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rankwise.algorithms.escape_directions.network import backprop, check_weights, init_weights, local_loss, parameter_norm
from rankwise.errors import InvalidInputError, NumericalError


@dataclass
class EscapeDirection:
    """A point rho on the sphere ||rho||^2 = L: weights [out, in] per layer, its speed s = -L_0(rho) and how close it
    is to a fixed point (cosine of grad L_0(rho) with -rho; 1 at an escape direction)."""

    weights: list[torch.Tensor]
    speed: float
    alignment: float
    restart_speeds: list[float] = field(default_factory=list)


def to_sphere(weights: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """theta rescaled to ||theta||^2 = L (L = number of layers)."""
    ws = check_weights(weights)
    norm = parameter_norm(ws)
    if not torch.isfinite(norm) or norm <= 0:
        raise InvalidInputError(f"cannot rescale a parameter vector of norm {float(norm)} onto the sphere")
    factor = math.sqrt(len(ws)) / norm
    return [w * factor for w in ws]


def local_loss_gradient(weights: Sequence[torch.Tensor], x: torch.Tensor, g: torch.Tensor, relu: bool = True
                        ) -> tuple[float, list[torch.Tensor]]:
    """(L_0(theta), grad L_0(theta) per layer [out, in]); dL_0/dY = G. `relu=False`: the deep linear net."""
    y, grads = backprop(weights, x, lambda y: _checked_g(g, y), relu)
    return float((g * y).sum()), grads


def _checked_g(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if g.shape != y.shape:
        raise InvalidInputError(f"G must be [d_L, N] = {list(y.shape)}, got {list(g.shape)}")
    return g


def escape_speed(weights: Sequence[torch.Tensor], x: torch.Tensor, g: torch.Tensor, relu: bool = True) -> float:
    """s = -L_0(rho) at rho = theta rescaled onto ||rho||^2 = L."""
    return -float(local_loss(to_sphere(weights), x, g, relu))


def fixed_point_alignment(weights: Sequence[torch.Tensor], x: torch.Tensor, g: torch.Tensor, relu: bool = True
                          ) -> float:
    """cos(grad L_0(rho), -rho) at rho = theta on the sphere: 1 exactly at an escape direction with s > 0."""
    rho = to_sphere(weights)
    _, grads = local_loss_gradient(rho, x, g, relu)
    gv = torch.cat([gr.reshape(-1) for gr in grads])
    rv = torch.cat([w.reshape(-1) for w in rho])
    denom = gv.norm() * rv.norm()
    return float(-(gv @ rv) / denom) if denom > 0 else 0.0


STEP_RULES = ("normalized", "plain")


def optimal_escape_direction(x: torch.Tensor, g: torch.Tensor, widths: Sequence[int], steps: int = 3000,
                             lr: float | None = None, restarts: int = 5, generator: torch.Generator | None = None,
                             dtype: torch.dtype = torch.float64, init: Sequence[torch.Tensor] | None = None,
                             step_rule: str = "normalized", relu: bool = True) -> EscapeDirection:
    """Minimise L_0 on ||theta||^2 = L by projected gradient descent; the best of `restarts` random starts.

    x [d_0, N], g [d_L, N]; widths = [d_0, ..., d_L]. `init` replaces the first random start. `relu=False` finds
    the deep linear net's escape direction (the card's baseline: every layer rank one).

    step_rule "plain" is the card's theta <- theta - lr grad L_0(theta) (lr defaults to 0.05 L), then rescale. Its
    step is proportional to |grad L_0|, which at a random point of the sphere is ~ width^(-(L-1)/2) ||G|| (1e-8 for
    digits at L = 6): it barely moves. "normalized" (default) takes a step of fixed relative size on the sphere,
    theta <- theta - lr(t) ||theta|| grad / ||grad||, with lr(t) decaying from lr (default 0.1) to lr / 1000 by a
    cosine, so it leaves the random start at once and still settles on a fixed point.
    """
    depth = len(widths) - 1
    if depth < 1 or widths[0] != x.shape[0] or widths[-1] != g.shape[0] or x.shape[1] != g.shape[1]:
        raise InvalidInputError(f"widths {list(widths)} do not match X {list(x.shape)} and G {list(g.shape)}")
    if steps < 1 or restarts < 1:
        raise InvalidInputError(f"steps and restarts must be >= 1, got {steps}, {restarts}")
    if step_rule not in STEP_RULES:
        raise InvalidInputError(f"step_rule must be one of {STEP_RULES}, got {step_rule!r}")
    eta = (0.05 * depth if step_rule == "plain" else 0.1) if lr is None else float(lr)
    x, g = x.to(dtype), g.to(dtype)
    radius = math.sqrt(depth)
    best: EscapeDirection | None = None
    speeds = []
    for r in range(restarts):
        start = list(init) if (init is not None and r == 0) else init_weights(widths, 1.0, generator, dtype)
        theta = to_sphere([w.to(dtype) for w in start])
        for t in range(steps):
            _, grads = local_loss_gradient(theta, x, g, relu)
            if step_rule == "plain":
                step = eta
            else:
                gnorm = math.sqrt(sum(float((gr * gr).sum()) for gr in grads))
                if gnorm == 0:
                    break
                step = eta * (1e-3 + (1 - 1e-3) * 0.5 * (1 + math.cos(math.pi * t / steps))) * radius / gnorm
            theta = to_sphere([w - step * gr for w, gr in zip(theta, grads)])
        s = -float(local_loss(theta, x, g, relu))
        if not math.isfinite(s):
            raise NumericalError(f"projected gradient diverged at restart {r} (speed {s}); lower lr (was {eta})")
        speeds.append(s)
        if best is None or s > best.speed:
            best = EscapeDirection(theta, s, fixed_point_alignment(theta, x, g, relu))
    assert best is not None
    best.restart_speeds = speeds
    return best


def norm_growth(t: torch.Tensor | float, norm0: float, depth: int, speed: float) -> torch.Tensor:
    """||theta(t)|| under gradient flow of L_0 started at norm0 on the ray of an escape direction with speed s.

    With theta = lambda * rho (||rho||^2 = L), d lambda / dt = s lambda^(L-1), so for L != 2
        ||theta(t)||^(2-L) = ||theta_0||^(2-L) + (2-L) * L^((2-L)/2) * s * t
    (finite-time blow-up at t* = ||theta_0||^(2-L) / ((L-2) L^((2-L)/2) s)), and ||theta_0|| e^(s t) for L = 2.
    The card writes the factor as L * s, which is this formula with s measured on the unit sphere
    (s_unit = L^(-L/2) s).
    """
    t = torch.as_tensor(t, dtype=torch.float64)
    if depth == 2:
        return norm0 * torch.exp(speed * t)
    base = norm0 ** (2 - depth) + (2 - depth) * depth ** ((2 - depth) / 2) * speed * t
    return base ** (1.0 / (2 - depth))
