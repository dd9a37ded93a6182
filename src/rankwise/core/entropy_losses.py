"""Entropy objectives of unsupervised and test-time adaptation, shared by the methods that adapt without labels
(EMAC's TENT and SHOT-IM arms, PFT's SHOT-IM baseline, ...).

- `entropy`: the Shannon entropy of each row's softmax, from log-softmax (stable for any logits);
- `information_maximization`: SHOT's IM loss, mean per-sample entropy minus the entropy of the mean prediction:
  confident per sample, diverse over the batch (its minimum is one-hot rows spread evenly over the classes).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) [B] of softmax(logits [B, C])."""
    logp = F.log_softmax(logits, dim=1)
    return -(logp.exp() * logp).sum(1)


def information_maximization(logits: torch.Tensor) -> torch.Tensor:
    """SHOT-IM: mean_i H(p_i) - H(mean_i p_i) for logits [B, C] (a scalar; -log C <= value <= log C)."""
    mean_p = logits.softmax(1).mean(0)
    return entropy(logits).mean() + (mean_p * mean_p.clamp_min(1e-12).log()).sum()
