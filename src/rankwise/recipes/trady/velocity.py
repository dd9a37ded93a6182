"""Velocity (Quélennec et al., WACV 2024), the paper's neuron-level baseline: NEq's per-neuron velocity on a fixed
set of examples, measured once per epoch, and the neurons with the largest |velocity| per parameter updated next.

Reading implemented (NEq, Bragagnolo et al. 2022, and the authors' code `NEq/core/utils/hooks.py`): after each epoch
t the outputs y_t of every neuron on the same examples are compared with the previous ones, δ_t = mean over examples
of 1 - cos(y_t, y_{t-1}) (the cosine over a neuron's spatial positions or tokens; over the examples for a [N, C']
output); Δφ_t = δ_{t-1} - δ_t (δ_{-1} = 0: the first velocity is -δ_0, so the neurons that moved most come first);
velocity v_t = Δφ_t - μ v_{t-1} (μ = 0.5, the code's `velocity_mu`). Neurons are ranked by |v_t| / (parameters per
neuron) and added until the weight budget is used (Velocity counts weights only); the first epoch is a random draw
(the code's `initialization: random`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


def neuron_outputs(y: torch.Tensor, kind: str) -> torch.Tensor:
    """A layer's output as [N, C', P] (P positions per neuron) or [N, C'] for a vector output."""
    if kind == "conv":
        return y.reshape(y.size(0), y.size(1), -1)
    if y.dim() == 2:
        return y
    return y.reshape(y.size(0), -1, y.size(-1)).transpose(1, 2)  # [N, T, C'] -> [N, C', T]


def _one_minus_cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean over examples of 1 - cos(a, b) per neuron, float64 [C']; a zero vector against a zero vector counts as
    unchanged (cos 1), one zero vector against a non-zero one as cos 0 (NEq's convention)."""
    a, b = a.double(), b.double()
    dim = 0 if a.dim() == 2 else 2
    na, nb = a.norm(dim=dim), b.norm(dim=dim)
    cos = (a * b).sum(dim=dim) / (na * nb).clamp_min(1e-300)
    cos = torch.where((na == 0) & (nb == 0), torch.ones_like(cos), torch.where((na == 0) | (nb == 0), torch.zeros_like(cos), cos))
    delta = 1.0 - cos
    return delta if dim == 0 else delta.mean(dim=0)


class VelocityTracker:
    """Per-layer NEq state over the fixed examples: the last outputs, the last δ and the velocity."""

    def __init__(self, layers: Sequence[str], momentum: float = 0.5) -> None:
        self.layers, self.momentum = tuple(layers), float(momentum)
        self.previous: dict[str, torch.Tensor] = {}
        self.delta: dict[str, torch.Tensor] = {}
        self.velocity: dict[str, torch.Tensor] = {}

    def observe(self, outputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """Take this evaluation's outputs ([N, C', P] or [N, C'] per layer); the velocities (float64 [C'] per layer)
        once there was an earlier evaluation to compare with, else None."""
        if not self.previous:
            self.previous = {n: outputs[n].detach().clone() for n in self.layers}
            return None
        for n in self.layers:
            delta = _one_minus_cos(outputs[n], self.previous[n])
            d_phi = self.delta.get(n, torch.zeros_like(delta)) - delta
            self.velocity[n] = d_phi - self.momentum * self.velocity.get(n, torch.zeros_like(delta))
            self.delta[n] = delta
            self.previous[n] = outputs[n].detach().clone()
        return dict(self.velocity)
