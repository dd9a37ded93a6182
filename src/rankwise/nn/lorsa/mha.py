"""The layer Lorsa replaces: causal multi-head (or grouped-query) attention with RoPE, and its exact Lorsa form.

`CausalSelfAttention` is a plain MHA/GQA layer in the HF Llama layout (q/k/v/o projections, weights [out, in]).
`lorsa_from_attention` writes any such layer as a Lorsa with n_qk = heads, d_qk = G = head_dim and K = n_ov: head
h's OV circuit W_V^h W_O^h splits into head_dim rank-1 pieces (row c of W_V^h, column c of W_O^h), so

    MHA(x) = sum_h A^h x W_V^h^T W_O^h^T = sum_h sum_c A^h (x . w_v^{h,c}) w_o^{h,c}.

With GQA the K/V rows of a KV group are shared by its query heads (duplicated per query head).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.nn.lorsa.checks import check_sequence
from rankwise.nn.lorsa.config import LorsaConfig
from rankwise.nn.lorsa.layer import Lorsa
from rankwise.nn.lorsa.rope import Rope


class CausalSelfAttention(nn.Module):
    """Causal MHA/GQA: x [batch, seq, d_model] -> [batch, seq, d_model] (the output after o_proj, no residual)."""

    def __init__(self, d_model: int, n_heads: int, head_dim: int, n_kv_heads: int | None = None,
                 rope: Rope | None = None, bias: bool = False) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if min(d_model, n_heads, head_dim, n_kv_heads) < 1 or n_heads % n_kv_heads:
            raise InvalidInputError(f"need positive sizes with n_heads ({n_heads}) a multiple of n_kv_heads ({n_kv_heads})")
        self.d_model, self.n_heads, self.head_dim, self.n_kv_heads = d_model, n_heads, head_dim, n_kv_heads
        self.rope = rope or Rope()
        self.rope.check_fits(head_dim)
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=bias)

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        check_sequence(x, self.d_model)
        B, T, _ = x.shape
        rep = self.n_heads // self.n_kv_heads
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2).repeat_interleave(rep, dim=1)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2).repeat_interleave(rep, dim=1)
        return self.rope.apply(q), self.rope.apply(k), v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(x)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(self.head_dim))
        return self.o_proj(o.transpose(1, 2).flatten(2))

    def patterns(self, x: torch.Tensor) -> torch.Tensor:
        """A [B, n_heads, T, T]."""
        q, k, _ = self._heads(x)
        T = x.size(1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        return s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf")).softmax(-1)

    def head_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """Each head's contribution to the output (o_proj's bias excluded): [B, T, n_heads, d_model]."""
        q, k, v = self._heads(x)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(self.head_dim))  # [B,H,T,dh]
        w = self.o_proj.weight.view(self.d_model, self.n_heads, self.head_dim)  # [d, H, dh]
        return torch.einsum("bhtc,dhc->bthd", o, w)


def lorsa_from_attention(q_weight: torch.Tensor, k_weight: torch.Tensor, v_weight: torch.Tensor,
                         o_weight: torch.Tensor, n_heads: int, n_kv_heads: int, rope: Rope | None = None,
                         attn_scale: float | None = None, q_bias: torch.Tensor | None = None,
                         k_bias: torch.Tensor | None = None, v_bias: torch.Tensor | None = None,
                         o_bias: torch.Tensor | None = None) -> Lorsa:
    """The exact Lorsa form (K = n_ov = n_heads * head_dim) of an attention layer given by its projections.

    q_weight [n_heads * hd, d], k_weight and v_weight [n_kv_heads * hd, d], o_weight [d, n_heads * hd] (torch's
    [out, in]); biases optional. `attn_scale` defaults to 1 / sqrt(hd). Returns a Lorsa in the weights' dtype.
    """
    if q_weight.dim() != 2 or n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads or q_weight.size(0) % n_heads:
        raise InvalidInputError(f"q_weight {tuple(q_weight.shape)} must be [n_heads * head_dim, d] with n_heads "
                                f"({n_heads}) a multiple of n_kv_heads ({n_kv_heads})")
    hd, d = q_weight.size(0) // n_heads, q_weight.size(1)
    kv = (n_kv_heads * hd, d)
    if tuple(k_weight.shape) != kv or tuple(v_weight.shape) != kv or tuple(o_weight.shape) != (d, n_heads * hd):
        raise InvalidInputError(f"with {n_heads} heads, {n_kv_heads} KV heads of {hd} dims and d = {d}: k/v weights must be "
                                f"{kv} and o_weight {(d, n_heads * hd)}; got {tuple(k_weight.shape)}, "
                                f"{tuple(v_weight.shape)}, {tuple(o_weight.shape)}")
    rep = n_heads // n_kv_heads
    n_ov = n_heads * hd
    config = LorsaConfig(d_model=d, n_qk=n_heads, n_ov=n_ov, d_qk=hd, k=n_ov, rope=rope or Rope(),
                         attn_scale=attn_scale, qk_bias=q_bias is not None or k_bias is not None)
    lorsa = Lorsa(config).to(q_weight.dtype)

    def per_query_head(t: torch.Tensor) -> torch.Tensor:  # [n_kv * hd, ...] -> [n_heads * hd, ...]
        return t.reshape(n_kv_heads, hd, *t.shape[1:]).repeat_interleave(rep, dim=0).reshape(n_ov, *t.shape[1:])

    with torch.no_grad():
        lorsa.W_Q.copy_(q_weight)
        lorsa.W_K.copy_(per_query_head(k_weight))
        lorsa.W_V.copy_(per_query_head(v_weight))
        lorsa.W_O.copy_(o_weight.T)  # column h*hd + c of o_proj is the direction OV piece (h, c) writes
        if config.qk_bias:
            lorsa.b_Q.copy_(q_bias if q_bias is not None else torch.zeros_like(lorsa.b_Q))
            lorsa.b_K.copy_(per_query_head(k_bias) if k_bias is not None else torch.zeros_like(lorsa.b_K))
        lorsa.b_V.copy_(per_query_head(v_bias) if v_bias is not None else torch.zeros_like(lorsa.b_V))
        lorsa.b_O.copy_(o_bias if o_bias is not None else torch.zeros_like(lorsa.b_O))
    return lorsa


def lorsa_from_mha(mha: CausalSelfAttention) -> Lorsa:
    """The exact Lorsa form of a `CausalSelfAttention` (see `lorsa_from_attention`)."""
    b = lambda lin: None if lin.bias is None else lin.bias.detach()  # noqa: E731
    return lorsa_from_attention(mha.q_proj.weight.detach(), mha.k_proj.weight.detach(), mha.v_proj.weight.detach(),
                                mha.o_proj.weight.detach(), mha.n_heads, mha.n_kv_heads, mha.rope,
                                q_bias=b(mha.q_proj), k_bias=b(mha.k_proj), v_bias=b(mha.v_proj), o_bias=b(mha.o_proj))
