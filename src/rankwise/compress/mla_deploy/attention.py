"""`MLAAttention`: multi-head latent attention that drops into a Llama decoder layer, with a latent-only KV cache.

Per token and layer the cache holds `r_K + r_V` latent numbers (`kv_a_proj`'s first outputs) plus one shared,
already-rotated RoPE key of `rope_dims` numbers: the cache's "keys" are the latent [B, 1, T, r_K + r_V] and its
"values" the rope key [B, 1, T, rope_dims] in a plain `transformers` DynamicCache (one pseudo-head each), exactly
as DeepSeek-V3 does in `transformers`. Nothing else is cached, so `cache_tensor_bytes` measures the real saving.

Attention scores of query head h (KV group j = h // n_rep), at the original scale 1/sqrt(dh):
    q_h . (W^b_K,j c_K)  +  RoPE(q_rope_h) . RoPE(k_rope)          output  o_h = softmax(.) (c_V W^b_V,j)
Two equivalent ways to compute them:
  * expanded (absorb=False): up-project every cached latent to per-group keys and values, then attend;
  * absorbed (absorb=True, DeepSeek-V2): fold W^b_K into the query (q_h W^b_K,j^T, width r_K) and W^b_V into the
    output (attend over c_V, then up-project the r_V-wide result), so the up-projections never touch the T cached
    tokens: one shared latent "head" is read by all query heads (MQA-like), which is what makes decoding cheap. A
    decoding step folds the query heads into query rows of that single head, so the cache is read once per step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rankwise.errors import InvalidInputError


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class MLAAttention(nn.Module):
    """Latent attention for one layer.

    Parameters (torch layout): q_proj [n_h*dh, D] (query for the position-free part, no rotation), q_rope_proj
    [n_h*2k, D], kv_a_proj [r_K + r_V + 2k, D] (latent K, latent V, shared rope key: what is cached), k_up
    [g*dh, r_K], v_up [g*dh, r_V], o_proj [D, n_h*dh]. `rope_index` [2k] picks the kept pairs' cos/sin columns
    out of the model's rotary embedding (head-dim layout).
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, k_rank: int, v_rank: int, rope_index: torch.Tensor, layer_idx: int, absorb: bool = True) -> None:
        super().__init__()
        rope_dims = int(rope_index.numel())
        if num_heads % num_kv_heads or min(k_rank, v_rank, rope_dims) < 1 or rope_dims % 2:
            raise InvalidInputError(f"bad MLA shapes: heads {num_heads}/{num_kv_heads}, ranks {k_rank}/{v_rank}, rope dims {rope_dims}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.k_rank, self.v_rank, self.rope_dims = k_rank, v_rank, rope_dims
        self.layer_idx, self.absorb, self.is_causal = layer_idx, absorb, True
        self.scaling = head_dim**-0.5
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.q_rope_proj = nn.Linear(hidden_size, num_heads * rope_dims, bias=False)
        self.kv_a_proj = nn.Linear(hidden_size, k_rank + v_rank + rope_dims, bias=False)
        self.k_up = nn.Linear(k_rank, num_kv_heads * head_dim, bias=False)
        self.v_up = nn.Linear(v_rank, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.register_buffer("rope_index", rope_index.clone().long(), persistent=False)
        self.register_buffer("head_group", torch.arange(num_heads) // (num_heads // num_kv_heads), persistent=False)
        self._rope_key = tuple(int(i) for i in rope_index.tolist())  # the kept columns, to share their cos/sin tables

    @property
    def latent_dims(self) -> int:
        """Numbers cached per token for this layer: r_K + r_V + rope_dims."""
        return self.k_rank + self.v_rank + self.rope_dims

    def _grouped(self, up: nn.Linear, rank: int) -> torch.Tensor:
        """An up-projection's weight by KV group: [g, dh, rank] (a view; query heads of a group share the block)."""
        return up.weight.view(self.num_kv_heads, self.head_dim, rank)

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor], attention_mask: torch.Tensor | None = None, cache=None, **kwargs) -> tuple[torch.Tensor, None]:
        """hidden_states [B, T, D] -> ([B, T, D], None). position_embeddings: the model's (cos, sin) [B, T, dh]."""
        bsz, q_len, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        q_rope = self.q_rope_proj(hidden_states).view(bsz, q_len, self.num_heads, self.rope_dims).transpose(1, 2)
        latent, k_rope = self.kv_a_proj(hidden_states).unsqueeze(1).split([self.k_rank + self.v_rank, self.rope_dims], dim=-1)

        cos, sin = _kept_rope_tables(position_embeddings, self.rope_index, self._rope_key)
        q_rope = q_rope * cos + rotate_half(q_rope) * sin
        k_rope = k_rope * cos + rotate_half(k_rope) * sin

        if cache is not None:  # the cache receives the latent and the rotated rope key, nothing else
            latent, k_rope = cache.update(latent.contiguous(), k_rope.contiguous(), self.layer_idx)
        kv_len = latent.size(-2)
        mask, causal = _attention_mask(attention_mask, q_len, kv_len, hidden_states.device)
        c_k, c_v = latent.split([self.k_rank, self.v_rank], dim=-1)  # [B, 1, S, r]

        if self.absorb:
            # Query heads as (group, head in group), so each group's up-projection block is used in place.
            by_group = (bsz, self.num_kv_heads, self.num_heads // self.num_kv_heads, q_len)
            q_latent = torch.einsum("bgntd,gdr->bgntr", q.view(*by_group, self.head_dim), self._grouped(self.k_up, self.k_rank))
            q_latent = q_latent.reshape(bsz, self.num_heads, q_len, self.k_rank)
            if q_len == 1:  # decoding: the hot path, reads the cached latent and rope key in place
                out = _single_head_decode(q_latent, q_rope, c_k, k_rope, c_v, mask, self.scaling)
            else:  # prefill: compute-bound, the shared head's broadcast is amortised over the T queries
                query = torch.cat([q_latent, q_rope], dim=-1)  # [B, n_h, T, r_K + 2k]
                key = torch.cat([c_k, k_rope], dim=-1)  # [B, 1, S, r_K + 2k]: one latent head shared by all
                out = F.scaled_dot_product_attention(query, key, c_v, attn_mask=mask, is_causal=causal, scale=self.scaling, enable_gqa=True)
            out = torch.einsum("bgntr,gdr->bgntd", out.reshape(*by_group, self.v_rank), self._grouped(self.v_up, self.v_rank))
            out = out.reshape(bsz, self.num_heads, q_len, self.head_dim)
        else:
            groups = (bsz, kv_len, self.num_kv_heads, self.head_dim)
            k_nope = self.k_up(c_k.squeeze(1)).view(groups).transpose(1, 2)  # [B, g, S, dh]
            value = self.v_up(c_v.squeeze(1)).view(groups).transpose(1, 2)
            key = torch.cat([k_nope, k_rope.expand(-1, self.num_kv_heads, -1, -1)], dim=-1)
            query = torch.cat([q, q_rope], dim=-1)
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=causal, scale=self.scaling, enable_gqa=True)
        out = out.transpose(1, 2).reshape(bsz, q_len, self.num_heads * self.head_dim)
        return self.o_proj(out), None

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}/{self.num_kv_heads}, head_dim={self.head_dim}, k_rank={self.k_rank}, v_rank={self.v_rank}, rope_dims={self.rope_dims}, absorb={self.absorb}"


def _single_head_decode(
    q_latent: torch.Tensor, q_rope: torch.Tensor, c_k: torch.Tensor, k_rope: torch.Tensor, c_v: torch.Tensor,
    mask: torch.Tensor | None, scale: float,
) -> torch.Tensor:
    """One decoding step against the shared latent head.

    q_latent [B, n_h, 1, r_K], q_rope [B, n_h, 1, 2k]; the cache's c_k [B, 1, S, r_K], k_rope [B, 1, S, 2k],
    c_v [B, 1, S, r_V] (views, read in place); mask None, bool (True = attend) or additive, [B, 1 or n_h, 1, S].
    -> [B, n_h, 1, r_V].

    The n_h query heads become n_h query rows of the single latent head, and the scores are the sum of the latent
    and the rope products, so the S cached entries are read once and never copied. SDPA with enable_gqa would
    broadcast the cache to every head, and concatenating [c_k | k_rope] copies it; on CPU at S = 2048 (SmolLM2 shapes)
    that cost 11 ms and 0.9 ms per layer and step against 0.18 ms here.
    """
    heads = q_latent.size(1)
    scores = (q_latent.transpose(1, 2) @ c_k.transpose(-1, -2)).add_(q_rope.transpose(1, 2) @ k_rope.transpose(-1, -2))
    scores.mul_(scale)  # [B, 1, n_h, S]
    if mask is not None:
        mask = mask.reshape(mask.size(0), 1, -1, mask.size(-1)) if mask.size(1) == heads else mask.transpose(1, 2)
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    wide = torch.float32 if scores.dtype in (torch.float16, torch.bfloat16) else scores.dtype  # never narrow float64
    probs = scores.softmax(dim=-1, dtype=wide).to(c_v.dtype)
    return (probs @ c_v).transpose(1, 2)


# The last (cos, sin) pair a layer received and its kept columns: every layer of a forward gets the same
# position_embeddings and (one global pair selection) keeps the same columns, so the gather runs once per forward
# instead of once per layer. Keyed by the tensors' identity (held here, so an id cannot be reused) and the columns.
_ROPE_TABLES: dict[str, tuple] = {}


def _kept_rope_tables(position_embeddings: tuple[torch.Tensor, torch.Tensor], rope_index: torch.Tensor, key: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept pairs' cos and sin [B, 1, T, 2k] out of the model's (cos, sin) [B, T, dh]."""
    cos, sin = position_embeddings
    last = _ROPE_TABLES.get("last")
    if last is not None and last[0] is cos and last[1] is sin and last[2] == key:
        return last[3], last[4]
    kept_cos, kept_sin = cos[..., rope_index].unsqueeze(1), sin[..., rope_index].unsqueeze(1)
    _ROPE_TABLES["last"] = (cos, sin, key, kept_cos, kept_sin)
    return kept_cos, kept_sin


def _attention_mask(mask: torch.Tensor | None, q_len: int, kv_len: int, device: torch.device) -> tuple[torch.Tensor | None, bool]:
    """(mask for SDPA, is_causal). transformers passes a bool (True = attend) or additive float [B, 1, T, S] mask,
    or None when plain causal masking suffices; queries sit at the last q_len of the kv_len positions."""
    if mask is not None:
        return mask[..., :kv_len], False
    if q_len == 1:
        return None, False
    if q_len == kv_len:
        return None, True
    rows = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    return torch.arange(kv_len, device=device)[None, :] <= rows, False
