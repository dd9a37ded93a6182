"""KV parity (CARE App. B): a GQA layer already *is* an MLA layer of rank r = num_kv_heads * head_dim.

Copying each KV head's rows to the `n_rep` query heads that share it gives `W~_K = R^T W_K` (torch layout, W_K
[kv_width, D]) with the 0/1 replication matrix R [kv_width, num_heads * head_dim]. So down = W_K and up = R^T is an
exact MLA factorization. Because R only copies columns, it changes neither singular vectors nor rank allocation, which is
why the conversion factors the un-replicated GQA matrix.
"""

from __future__ import annotations

import torch

from rankwise.errors import InvalidInputError


def head_replication_matrix(num_kv_heads: int, num_heads: int, head_dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """R [num_kv_heads * head_dim, num_heads * head_dim]: query head h reads KV head h // n_rep (transformers' repeat_kv order)."""
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise InvalidInputError(f"{num_heads} query heads cannot be grouped over {num_kv_heads} KV heads")
    n_rep = num_heads // num_kv_heads
    r = torch.zeros(num_kv_heads * head_dim, num_heads * head_dim, dtype=dtype)
    eye = torch.eye(head_dim, dtype=dtype)
    for h in range(num_heads):
        g = h // n_rep
        r[g * head_dim : (g + 1) * head_dim, h * head_dim : (h + 1) * head_dim] = eye
    return r


def kv_parity_factors(w: torch.Tensor, num_kv_heads: int, num_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact MLA factors (down, up) = (W, R^T) of a GQA projection W [kv_width, D] (torch layout): up @ down is
    the per-query-head projection [num_heads * head_dim, D]."""
    if w.dim() != 2 or w.size(0) != num_kv_heads * head_dim:
        raise InvalidInputError(f"W must be [{num_kv_heads * head_dim}, D], got {tuple(w.shape)}")
    return w, head_replication_matrix(num_kv_heads, num_heads, head_dim, w.dtype).T
