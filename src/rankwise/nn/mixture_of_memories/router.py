"""The token-to-memory router of Mixture-of-Memories and its Switch-style load-balancing loss.

    s_t = softmax(x_t W_g)  (W_g [d_model, M], no bias; at least float32)      K_t = top-k indices of s_t
    g_t^m = s_t^m / sum_{m' in K_t} s_t^{m'} for m in K_t, 0 elsewhere

The routing weights only scale the read-out; the write mask is "m in K_t" (never the weight's size).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rankwise.errors import InvalidInputError


@dataclass(frozen=True)
class Routing:
    """logits [..., M]; weights [..., M] (sum to 1 over the top-k, 0 elsewhere); routed [..., M] bool (m in K_t);
    indices [..., k] (the top-k memories, best first)."""

    logits: torch.Tensor
    weights: torch.Tensor
    routed: torch.Tensor
    indices: torch.Tensor


def _at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


class TopKRouter(nn.Module):
    """x [..., d_model] -> `Routing` over `num_memories` memories, `top_k` of them per token."""

    def __init__(self, d_model: int, num_memories: int, top_k: int) -> None:
        super().__init__()
        if top_k > num_memories:
            raise InvalidInputError(f"top_k = {top_k} is larger than num_memories = {num_memories}: a token cannot "
                                    "be routed to more memories than exist")
        self.num_memories, self.top_k = num_memories, top_k
        self.gate = nn.Linear(d_model, num_memories, bias=False)

    def forward(self, x: torch.Tensor) -> Routing:
        logits = self.gate(x)
        probs = _at_least_fp32(logits).softmax(-1)
        top, indices = probs.topk(self.top_k, dim=-1)
        # top-1: the weight is exactly 1 (p / p has a rounding-level gradient, not a signal worth passing on)
        top = top / top.sum(-1, keepdim=True) if self.top_k > 1 else torch.ones_like(top)
        weights = torch.zeros_like(probs).scatter(-1, indices, top).to(x.dtype)
        routed = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, indices, True)
        return Routing(logits, weights, routed, indices)


def load_balancing_loss(router_logits: torch.Tensor | Sequence[torch.Tensor], top_k: int) -> torch.Tensor:
    """aux = M * sum_{slot j < k} sum_e f_{j,e} P_e over all tokens (of all layers, when given a list).

    router_logits: [..., M] per layer (a list is concatenated over tokens). f_{j,e}: fraction of tokens whose j-th
    choice is e; P_e: mean router probability of e. Uniform routing and probabilities give exactly k; routing that
    collapses onto few memories gives more (up to M for k = 1). The model adds `0.01 * aux` to its loss.
    """
    if isinstance(router_logits, torch.Tensor):
        router_logits = [router_logits]
    if len(router_logits) == 0:
        raise InvalidInputError("load_balancing_loss needs the router logits of at least one layer")
    M = router_logits[0].shape[-1]
    if any(t.shape[-1] != M for t in router_logits):
        raise InvalidInputError(f"every layer's router logits must have the same number of memories, got "
                                f"{[t.shape[-1] for t in router_logits]}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= M:
        raise InvalidInputError(f"top_k must be an int in [1, {M}], got {top_k!r}")
    probs = torch.cat([_at_least_fp32(t).reshape(-1, M) for t in router_logits]).softmax(-1)  # [T, M]
    if probs.shape[0] == 0:
        raise InvalidInputError("load_balancing_loss got no tokens")
    choice = probs.topk(top_k, dim=-1).indices  # [T, k]
    f = torch.nn.functional.one_hot(choice, M).to(probs.dtype).mean(0)  # [k, M]: f_{j,e}
    return M * (f * probs.mean(0)).sum()


__all__ = ["Routing", "TopKRouter", "load_balancing_loss"]
