"""The auxiliary top-K loss that revives dead heads (Lorsa) or latents (the SAE), after Gao et al. (2024).

A unit is *dead* when the main top-K has not selected it at any token for `dead_steps` optimiser steps. The dead
units' own activations, top `aux_k` per token by the same selection score, are asked to reconstruct the main
model's residual e = y - y_hat (normalised units, e detached):

    L_aux = ||e - sum_{i in S_aux} z_i w_i||^2 / ||e - mean(e)||^2          (summed over the tokens of the batch)

so a dead unit gets a gradient exactly in the direction that would make it useful, and stops being dead once its
activation wins the main top-K. Without it a short fit on real activations leaves most of a wide Lorsa unused
(75% of 2,304 heads in a 2e5-token fit of SmolLM2's layer 15); the paper's 8e8-token runs use no such term.
Both arms of a comparison use the same term, so it is no advantage of one over the other.
"""

from __future__ import annotations

import torch


class DeadUnits:
    """Per-unit count of optimiser steps since the main top-K last selected the unit (any token of the batch)."""

    def __init__(self, n: int, dead_steps: int) -> None:
        self.idle = torch.zeros(n, dtype=torch.long)
        self.dead_steps = dead_steps

    def update(self, idx: torch.Tensor) -> None:
        """Record one step's main selection, indices [..., k] into the n units."""
        fired = torch.zeros_like(self.idle, dtype=torch.bool)
        fired[idx.reshape(-1)] = True
        self.idle = torch.where(fired, torch.zeros_like(self.idle), self.idle + 1)

    def mask(self) -> torch.Tensor:
        """Dead units [n] bool: idle for at least `dead_steps` steps."""
        return self.idle >= self.dead_steps


def aux_loss(scores: torch.Tensor, values: torch.Tensor, dead: torch.Tensor, residual: torch.Tensor, aux_k: int,
             readout) -> torch.Tensor:
    """Normalised MSE of the dead units' top-`aux_k` reconstruction of `residual` (a scalar; 0 if none is dead).

    scores, values: the dense selection scores and activations [B, T, n]; dead [n] bool; residual [B, T, d]
    (detached, normalised units); readout(vals, idx) -> [B, T, d], the units' write directions without bias.
    """
    n_dead = int(dead.sum())
    if n_dead == 0:
        return values.new_zeros(())
    k = min(aux_k, n_dead)
    masked = scores.masked_fill(~dead, float("-inf"))
    idx = masked.topk(k, dim=-1, sorted=False).indices
    recon = readout(values.gather(-1, idx), idx)
    flat = residual.reshape(-1, residual.size(-1))
    total = (flat - flat.mean(0)).pow(2).sum().clamp_min(torch.finfo(residual.dtype).tiny)
    return (residual - recon).pow(2).sum() / total
