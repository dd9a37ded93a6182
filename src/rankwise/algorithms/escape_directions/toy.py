"""The paper's Example 1: the first layer of an optimal escape direction need not be rank one.

Eight points x_i = (cos(i pi/4), sin(i pi/4)), i = 0..7, with G_i = -1 for even i and +1 for odd i; a depth-3
bias-free ReLU net. Rank-1 weights reach at best s = sqrt(2) - 1; the rank-2 first layer below reaches s = 1/2 with
every ||W_l||_F^2 = 1, computing Y = ReLU(|x_1| - |x_2|) / 4.
"""

from __future__ import annotations

import math

import torch

RANK_ONE_SPEED = math.sqrt(2) - 1  # the best escape speed of all-rank-1 weights (the paper's Example 1)


def toy_data(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """(X [2, 8], G [1, 8])."""
    i = torch.arange(8, dtype=dtype)
    x = torch.stack([torch.cos(i * math.pi / 4), torch.sin(i * math.pi / 4)])
    g = torch.where(i.long() % 2 == 0, -1.0, 1.0).to(dtype)[None, :]
    return x, g


def toy_rank_two_escape(dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    """W_1 = [[1,0],[0,1],[-1,0],[0,-1]] / 2, W_2 = [1,-1,1,-1] / 2, W_3 = [1]: speed exactly 1/2."""
    w1 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]], dtype=dtype) / 2
    w2 = torch.tensor([[1.0, -1.0, 1.0, -1.0]], dtype=dtype) / 2
    w3 = torch.tensor([[1.0]], dtype=dtype)
    return [w1, w2, w3]
