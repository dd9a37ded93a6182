"""The main comparator: a Top-K sparse autoencoder on the attention output, same width and L0 as the Lorsa.

    z = TopK(ReLU(W_enc (y - b_dec) + b_enc)),   y_hat = sum_{i in S} z_i d_i + b_dec

with decoder rows d_i kept at unit norm (renormalised after each step by the fit), so a latent's size is its
activation. It reconstructs Y from Y, which is easier than Lorsa's task of predicting Y from the attention input.
"""

from __future__ import annotations

import torch
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.nn.lorsa.checks import check_k, check_sequence
from rankwise.nn.lorsa.topk import sparse_readout, top_k


class TopKSAE(nn.Module):
    """y [batch, seq, d] -> y_hat [batch, seq, d] through `k` of `n_latents` latents per token."""

    def __init__(self, d_model: int, n_latents: int, k: int) -> None:
        super().__init__()
        if d_model < 1 or n_latents < 1:
            raise InvalidInputError(f"d_model and n_latents must be positive, got {d_model}, {n_latents}")
        self.d_model, self.n_latents, self.k = d_model, n_latents, check_k(k, n_latents, "latents")
        self.W_enc = nn.Parameter(torch.randn(n_latents, d_model) / d_model**0.5)
        self.b_enc = nn.Parameter(torch.zeros(n_latents))
        # Tied initialisation (decoder = encoder, unit rows) avoids dead latents at the start.
        self.W_dec = nn.Parameter(self.W_enc.detach().clone() / self.W_enc.detach().norm(dim=-1, keepdim=True))
        self.b_dec = nn.Parameter(torch.zeros(d_model))
        self.register_buffer("input_scale", torch.ones(()))
        self.register_buffer("output_scale", torch.ones(()))

    def codes(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the top-K ranks and keeps: y [B, T, d] -> (scores, pre-activations), both [B, T, n_latents]."""
        check_sequence(y, self.d_model, "y")
        ys = y * self.input_scale.to(y.dtype)
        pre = torch.relu((ys - self.b_dec) @ self.W_enc.T + self.b_enc)
        return pre.detach(), pre

    def encode(self, y: torch.Tensor, k: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """y [B, T, d] -> (latent values [B, T, k], indices [B, T, k])."""
        k = check_k(self.k if k is None else k, self.n_latents, "latents")
        return top_k(*self.codes(y), k)

    def readout(self, vals: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """sum of the selected latents' decoder rows z_i d_i, normalised units, no bias: [B, T, k] -> [B, T, d]."""
        return sparse_readout(vals, idx, self.W_dec)

    def decode(self, vals: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """(values, indices) [B, T, k] -> y_hat [B, T, d] in raw units."""
        return (self.readout(vals, idx) + self.b_dec) / self.output_scale.to(vals.dtype)

    def forward(self, y: torch.Tensor, k: int | None = None) -> torch.Tensor:
        return self.decode(*self.encode(y, k))

    @torch.no_grad()
    def after_step(self) -> None:
        """Unit-norm decoder rows (called by the fit after every optimiser step)."""
        self.W_dec.div_(self.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-12))
