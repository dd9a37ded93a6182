"""Diversity regularisers of patch features that the paper compares IVQ with: they raise the rank of Z_p without
regard to concepts.

- `spectral_loss`: minus the normalised nuclear norm of each image's Z_p [L, D],
  -||Z||_* / (||Z||_F sqrt(min(L, D))), in [-1, 0): -1 when all singular values are equal (full, flat spectrum).
- `barlow_loss`: Barlow-Twins-style decorrelation of the feature dimensions over the patches of each image: the
  off-diagonal squares of the correlation matrix of standardised columns, normalised by D(D - 1).
"""

from __future__ import annotations

import torch

from rankwise.nn.ivq.quantizer import check_tokens


def spectral_loss(z: torch.Tensor) -> torch.Tensor:
    """z [B, L, D] -> scalar; lower is flatter spectra (higher rank)."""
    check_tokens(z, z.shape[-1])
    sigma = torch.linalg.svdvals(z)  # [B, r]
    r = sigma.shape[-1]
    ratio = sigma.sum(-1) / (sigma.pow(2).sum(-1).sqrt().clamp_min(1e-8) * r**0.5)
    return -ratio.mean()


def barlow_loss(z: torch.Tensor) -> torch.Tensor:
    """z [B, L, D] (L >= 2) -> scalar >= 0; 0 when the feature dimensions are uncorrelated over patches."""
    check_tokens(z, z.shape[-1])
    zs = (z - z.mean(1, keepdim=True)) / z.std(1, keepdim=True).clamp_min(1e-5)
    corr = zs.transpose(1, 2) @ zs / max(1, z.shape[1] - 1)  # [B, D, D]
    d = corr.shape[-1]
    off = corr - torch.diag_embed(torch.diagonal(corr, dim1=1, dim2=2))
    return off.pow(2).sum((1, 2)).mean() / max(1, d * (d - 1))
