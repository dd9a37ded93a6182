"""The tiny recall model: embedding, pre-norm blocks (token mixer + SwiGLU MLP), LM head; one mixer per arm."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from rankwise.nn.mixture_of_memories import (
    CausalSoftmaxAttention, LinearAttention, MixtureOfMemories, load_balancing_loss,
)

SOFTMAX, SINGLE, EXPANDED, MOM = "softmax attention", "single memory", "expanded single memory (key < pairs)", "MoM"
ARMS = (MOM, SINGLE, EXPANDED, SOFTMAX)


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


class Block(nn.Module):
    def __init__(self, d: int, mixer: nn.Module, mlp_hidden: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        self.mixer, self.mlp = mixer, SwiGLU(d, mlp_hidden)

    def forward(self, x: torch.Tensor, routers: list[torch.Tensor]) -> torch.Tensor:
        h = self.norm1(x)
        if isinstance(self.mixer, MixtureOfMemories):
            out, routing = self.mixer(h, return_routing=True)
            routers.append(routing.logits)
        else:
            out = self.mixer(h)
        x = x + out
        return x + self.mlp(self.norm2(x))


class RecallModel(nn.Module):
    """tokens [batch, seq] -> (logits [batch, seq, vocab], router logits of every MoM layer).

    `mlp_hidden` defaults to 2 d (SwiGLU ratio 2); only the expanded single memory widens it, to reach MoM's parameter
    count without giving its memory more key dimensions."""

    def __init__(self, vocab: int, d: int, layers: int, make_mixer: Callable[[], nn.Module],
                 mlp_hidden: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        hidden = 2 * d if mlp_hidden is None else mlp_hidden
        self.blocks = nn.ModuleList([Block(d, make_mixer(), hidden) for _ in range(layers)])
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x, routers = self.embed(tokens), []
        for block in self.blocks:
            x = block(x, routers)
        return self.head(self.norm(x)), routers


def make_mixer(arm: str, d: int, heads: int, head_dim: int, memories: int, top_k: int, expanded_key_dim: int,
               chunk_size: int) -> Callable[[], nn.Module]:
    """A factory of the arm's token mixer (all with the same projections, short convs and read-out); the expanded
    single memory has key size `expanded_key_dim` per head, the others `head_dim`."""
    if arm == MOM:
        return lambda: MixtureOfMemories(d, heads, head_dim, head_dim, memories, top_k, True, chunk_size=chunk_size)
    if arm == SINGLE:
        return lambda: LinearAttention(d, heads, head_dim, head_dim, chunk_size=chunk_size)
    if arm == EXPANDED:
        return lambda: LinearAttention(d, heads, expanded_key_dim, head_dim, chunk_size=chunk_size)
    if arm == SOFTMAX:
        return lambda: CausalSoftmaxAttention(d, heads, head_dim, head_dim)
    raise ValueError(f"unknown arm {arm!r}")


def aux_loss(routers: list[torch.Tensor], top_k: int) -> torch.Tensor | None:
    return load_balancing_loss(routers, top_k) if routers else None


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["ARMS", "EXPANDED", "MOM", "RecallModel", "SINGLE", "SOFTMAX", "aux_loss", "make_mixer", "n_params"]
