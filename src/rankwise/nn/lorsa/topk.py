"""Top-K selection across heads (Lorsa) or latents (the SAE baseline), and the sparse read-out it feeds."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def top_k(scores: torch.Tensor, values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """At each row keep the `k` entries of `values` with the largest `scores` (both [..., n]).

    Returns (kept values [..., k], their indices [..., k] int64). Gradients flow to the kept values only.
    """
    idx = scores.topk(k, dim=-1, sorted=False).indices
    return values.gather(-1, idx), idx


def sparse_readout(vals: torch.Tensor, idx: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """sum_j vals[..., j] * rows[idx[..., j]]: vals, idx [..., k], rows [n, d] -> [..., d].

    `embedding_bag` sums the k weighted rows without materialising the [..., k, d] gather, so forward and backward
    cost O(k d) per token instead of the O(n d) of a dense product with the mostly-zero activation vector.
    """
    k, d = vals.size(-1), rows.size(-1)
    out = F.embedding_bag(idx.reshape(-1, k), rows, per_sample_weights=vals.reshape(-1, k), mode="sum")
    return out.reshape(*vals.shape[:-1], d)


def scatter_dense(vals: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    """The kept values at their indices, zeros elsewhere: vals, idx [..., k] -> [..., n]."""
    return torch.zeros(*vals.shape[:-1], n, dtype=vals.dtype, device=vals.device).scatter(-1, idx, vals)
