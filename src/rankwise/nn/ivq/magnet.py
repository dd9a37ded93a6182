"""Magnet attention: soft clustering of patch tokens into K concept prototypes (IVQ-CBM's `vq_aggregator`).

K learnable queries Q [K, D] (randn init, as the authors'). Each patch j is assigned softly over the queries,

    A[b, j, k] = softmax_k( -||z_bj - q_k||^2 / temperature )      (rows sum to 1 over k; temperature 1 = the paper)

and the prototypes are the unnormalised weighted sums M_b = A_b^T Z_b [K, D] (a sum over patches, not a mean).
The prototype of query k is scored against the text embeddings of concept group k only (apps.vision.cbm).
"""

from __future__ import annotations

import torch
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.nn.ivq.quantizer import check_tokens


class MagnetAttention(nn.Module):
    """z [B, L, D] -> (prototypes [B, K, D], assignments [B, L, K])."""

    def __init__(self, num_queries: int, dim: int, temperature: float = 1.0) -> None:
        super().__init__()
        if num_queries < 1 or dim < 1:
            raise InvalidInputError(f"Magnet attention needs num_queries >= 1 and dim >= 1, got {num_queries}, {dim}")
        if not temperature > 0:
            raise InvalidInputError(f"temperature must be > 0, got {temperature}")
        self.num_queries, self.dim, self.temperature = num_queries, dim, float(temperature)
        self.queries = nn.Parameter(torch.randn(num_queries, dim))

    def assignments(self, z: torch.Tensor) -> torch.Tensor:
        """A [B, L, K]: softmax over the K queries of -||z_j - q_k||^2 / temperature."""
        check_tokens(z, self.dim)
        d2 = ((z.unsqueeze(-2) - self.queries) ** 2).sum(-1)  # [B, L, K]; the difference form keeps float64 exact
        return torch.softmax(-d2 / self.temperature, dim=-1)

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.assignments(z)
        return a.transpose(1, 2) @ z, a  # [B, K, L] @ [B, L, D]

    def extra_repr(self) -> str:
        return f"num_queries={self.num_queries}, dim={self.dim}, temperature={self.temperature}"
