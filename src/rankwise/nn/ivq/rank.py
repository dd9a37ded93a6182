"""The effective rank of patch features over training: the "low-rank trap" diagnostic.

Two readings of the singular values sigma of each image's patch matrix Z_p [L, D] (float64 SVD), averaged over the
batch:
- `cumulative_rank` (the authors' convention, IVQ-CBM's train.py): #{i : cumsum(sigma)_i / sum(sigma) <= threshold}
  with threshold 0.99 -- an integer count per image, so I_n gives n - 1 (the n-th partial sum is exactly 1 > 0.99)
  and a rank-1 matrix gives 0 (its first partial sum is already 1);
- the entropy effective rank of Roy & Vetterli, `rankwise.core.rank_measures.effective_rank` (n for I_n, 1 for
  rank 1), reused, not rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.core.rank_measures import effective_rank
from rankwise.errors import InvalidInputError


def cumulative_rank(sigma: torch.Tensor, threshold: float = 0.99) -> int:
    """#{i : cumsum(sigma)_i / sum(sigma) <= threshold} for singular values sigma [n] (sorted here, descending);
    0 for a zero matrix."""
    if not 0 < threshold <= 1:
        raise InvalidInputError(f"the cumulative threshold must be in (0, 1], got {threshold}")
    s = torch.sort(sigma.detach().to(torch.float64).flatten(), descending=True).values
    total = s.sum()
    if total <= 0:
        return 0
    # a tiny slack so that an exact partial sum such as 99/100 counts despite rounding of the cumulative sum
    return int((torch.cumsum(s, 0) / total <= threshold + 1e-12).sum())


@dataclass(frozen=True)
class RankReading:
    """Batch means of the two effective ranks of Z_p, and the largest possible rank min(L, D)."""

    cumulative: float
    entropy: float
    max_rank: int

    def to_dict(self) -> dict[str, float]:
        return {"cumulative": self.cumulative, "entropy": self.entropy, "max_rank": self.max_rank}


@torch.no_grad()
def patch_rank(z: torch.Tensor, threshold: float = 0.99) -> RankReading:
    """Effective ranks of patch features z [B, L, D] (per image, batch-averaged)."""
    if z.dim() != 3 or min(z.shape) < 1:
        raise InvalidInputError(f"patch features must be [B, L, D], got {tuple(z.shape)}")
    sigmas = torch.linalg.svdvals(z.detach().to(torch.float64))  # [B, min(L, D)]
    cum = [cumulative_rank(s, threshold) for s in sigmas]
    ent = [effective_rank(s) for s in sigmas]
    return RankReading(sum(cum) / len(cum), sum(ent) / len(ent), int(min(z.shape[1], z.shape[2])))
