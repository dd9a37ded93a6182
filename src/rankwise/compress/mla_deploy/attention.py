"""`MLAAttention`: multi-head latent attention that drops into a Llama decoder layer, with a latent-only KV cache.

Per token and layer the cache holds the latent (`kv_a_proj`'s first outputs) plus one shared, already-rotated RoPE
key of `rope_dims` numbers: the cache's "keys" are the latent [B, 1, T, r] and its "values" the rope key
[B, 1, T, rope_dims] in a plain `transformers` DynamicCache (one pseudo-head each), exactly as DeepSeek-V3 does in
`transformers`. Nothing else is cached, so `cache_tensor_bytes` measures the real saving. The latent is either
split, [c_K | c_V] with r = r_K + r_V (CARE's and Palu's factors: K and V factored separately), or joint, one c of
width r = r_K = r_V read by both up-projections (MHA2MLA's and DeepSeek's: one down-projection shared by K and V).

Attention scores of query head h (KV group j = h // n_rep), at the original scale 1/sqrt(dh):
    q_h . (W^b_K,j c_K)  +  RoPE(q_rope_h) . RoPE(k_rope)          output  o_h = softmax(.) (c_V W^b_V,j)
Two equivalent ways to compute them:
  * expanded (absorb=False): up-project every cached latent to per-group keys and values, then attend;
  * absorbed (absorb=True, DeepSeek-V2): fold W^b_K into the query (q_h W^b_K,j^T, width r_K) and W^b_V into the
    output (attend over c_V, then up-project the r_V-wide result), so the up-projections never touch the T cached
    tokens: one shared latent "head" is read by all query heads (MQA-like), which is what makes decoding cheap. A
    decoding step folds the query heads into query rows of that single head, so the cache is read once per step.

Fused decoding (absorbed, grad disabled, one new token). At batch 1 a decoding step costs the weights it reads and
the count of small ops per layer, so `_fused_decode` runs it from `FusedWeights`: q_proj, kv_a_proj and
q_rope_proj as one matmul (softmax scale folded in), one rotation for all rope dims, group-batched up-projections,
o_proj. Those are copies, rebuilt whenever a parameter they come from changes (`FusedWeights.matches`) and
dropped by every grad-enabled forward; training, prefill and the state_dict use the parameters (the path below
`forward`'s first lines), which is also the reference the fused step is tested against. W^b_K and W^b_V stay
separate small matmuls: folding them into q_proj / o_proj (DeepSeek-V2's full absorption) turns those n_h * dh
rows / columns into n_h * r, more weight bytes per step whenever r > dh (SmolLM2: 80 > 64; measured no faster).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from rankwise.errors import InvalidInputError


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


@dataclass(frozen=True)
class FusedWeights:
    """One layer's inference-only weights for `_fused_decode`, and what they were built from.

    input_t [D, n_h*dh + r_K + r_V + (n_h + 1)*2k]: the transposed rows of q_proj (times the softmax scale), of
    kv_a_proj's latent part, of q_rope_proj (times the scale) and of kv_a_proj's rope-key part, so `x @ input_t` is
    [q | latent | every head's rope query | rope key] (`splits`): the query and key rope dims sit side by side and
    rotate in one op. output_t [n_h*dh, D]: o_proj transposed. Transposed ([in, out], unlike the parameters'
    [out, in]) because at one thread MKL streams a [D, N] matrix for a one-row x @ W about 1.5x faster than
    F.linear streams the [N, D] one, and reading weights is what a batch-1 decoding step costs. k_up [g, dh, r_K]
    and v_up_t [g, r_V, dh]: the up-projections by KV group (views of the parameters).

    sources: (detached view, `_version`) of each parameter read. A view shares the parameter's version counter and
    holds its storage, so a parameter whose data was replaced (`.to()`, `.data =`, a new Parameter) can never show
    the old data_ptr; in-place writes through autograd (non-fused optimizers, load_state_dict, no-grad edits) bump
    `_version`. optimizer_steps: the process's optimizer-step count at build time, because fused optimizer kernels
    (AdamW(fused=True)) write without bumping `_version`. Writes through `.data` bypass all of these, as they bypass
    autograd's own checks: call `MLAAttention.drop_fused_weights()` after them.
    """

    input_t: torch.Tensor
    output_t: torch.Tensor
    k_up: torch.Tensor
    v_up_t: torch.Tensor
    splits: tuple[int, int, int]
    sources: tuple[tuple[torch.Tensor, int], ...]
    optimizer_steps: int

    def matches(self, params: tuple[torch.Tensor, ...], optimizer_steps: int) -> bool:
        """Whether these weights were built from `params` as they are now."""
        if optimizer_steps != self.optimizer_steps:
            return False
        for p, (held, version) in zip(params, self.sources):
            if p._version != version or p.data_ptr() != held.data_ptr():
                return False
        return True


class _OptimizerSteps:
    """Counts torch optimizer steps in this process (a global step hook, registered on first use)."""

    count = 0
    _handle = None

    @classmethod
    def now(cls) -> int:
        if cls._handle is None:
            cls._handle = register_optimizer_step_post_hook(cls._count)
        return cls.count

    @classmethod
    def _count(cls, optimizer, args, kwargs) -> None:
        cls.count += 1


_FUSED_SOURCES = ("q_proj", "q_rope_proj", "kv_a_proj", "k_up", "v_up", "o_proj")  # the layers FusedWeights reads


class MLAAttention(nn.Module):
    """Latent attention for one layer.

    Parameters (torch layout): q_proj [n_h*dh, D] (query for the position-free part, no rotation), q_rope_proj
    [n_h*2k, D], kv_a_proj [r + 2k, D] (the latent and the shared rope key: what is cached; r = r_K + r_V, or with
    `joint` r = r_K = r_V, one latent both up-projections read), k_up [g*dh, r_K], v_up [g*dh, r_V], o_proj
    [D, n_h*dh]. `rope_index` [2k] picks the kept pairs' cos/sin columns
    out of the model's rotary embedding (head-dim layout). `fused_inference` (default True): no-grad absorbed
    decoding steps run `_fused_decode`; False runs them from the parameters, as training does.
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, k_rank: int, v_rank: int, rope_index: torch.Tensor, layer_idx: int, absorb: bool = True, joint: bool = False) -> None:
        super().__init__()
        rope_dims = int(rope_index.numel())
        if num_heads % num_kv_heads or min(k_rank, v_rank, rope_dims) < 1 or rope_dims % 2:
            raise InvalidInputError(f"bad MLA shapes: heads {num_heads}/{num_kv_heads}, ranks {k_rank}/{v_rank}, rope dims {rope_dims}")
        if joint and k_rank != v_rank:
            raise InvalidInputError(f"a joint latent is read whole by K and V: k_rank must equal v_rank, got {k_rank}/{v_rank}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.k_rank, self.v_rank, self.rope_dims, self.joint = k_rank, v_rank, rope_dims, bool(joint)
        self.latent_rank = k_rank if joint else k_rank + v_rank  # the cached latent's width
        self.layer_idx, self.absorb, self.is_causal = layer_idx, absorb, True
        self.fused_inference = True
        self.scaling = head_dim**-0.5
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.q_rope_proj = nn.Linear(hidden_size, num_heads * rope_dims, bias=False)
        self.kv_a_proj = nn.Linear(hidden_size, self.latent_rank + rope_dims, bias=False)
        self.k_up = nn.Linear(k_rank, num_kv_heads * head_dim, bias=False)
        self.v_up = nn.Linear(v_rank, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.register_buffer("rope_index", rope_index.clone().long(), persistent=False)
        self.register_buffer("head_group", torch.arange(num_heads) // (num_heads // num_kv_heads), persistent=False)
        self._rope_key = tuple(int(i) for i in rope_index.tolist())  # the kept columns, to share their cos/sin tables
        self._fused: FusedWeights | None = None

    @property
    def latent_dims(self) -> int:
        """Numbers cached per token for this layer: the latent's width (r_K + r_V, or r when joint) + rope_dims."""
        return self.latent_rank + self.rope_dims

    def _latents(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(c_K, c_V): views of the cached latent [..., r] that K and V read; the same tensor twice when joint."""
        if self.joint:
            return latent, latent
        return latent.split([self.k_rank, self.v_rank], dim=-1)

    def _grouped(self, up: nn.Linear, rank: int) -> torch.Tensor:
        """An up-projection's weight by KV group: [g, dh, rank] (a view; query heads of a group share the block)."""
        return up.weight.view(self.num_kv_heads, self.head_dim, rank)

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor], attention_mask: torch.Tensor | None = None, cache=None, **kwargs) -> tuple[torch.Tensor, None]:
        """hidden_states [B, T, D] -> ([B, T, D], None). position_embeddings: the model's (cos, sin) [B, T, dh]."""
        bsz, q_len, _ = hidden_states.shape
        if torch.is_grad_enabled():
            self._fused = None  # a training step may follow: never keep copies across one
        elif q_len == 1 and self.absorb and self.fused_inference:
            return self._fused_decode(hidden_states, position_embeddings, attention_mask, cache), None
        q = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        q_rope = self.q_rope_proj(hidden_states).view(bsz, q_len, self.num_heads, self.rope_dims).transpose(1, 2)
        latent, k_rope = self.kv_a_proj(hidden_states).unsqueeze(1).split([self.latent_rank, self.rope_dims], dim=-1)

        cos, sin = _kept_rope_tables(position_embeddings, self.rope_index, self._rope_key)
        q_rope = q_rope * cos + rotate_half(q_rope) * sin
        k_rope = k_rope * cos + rotate_half(k_rope) * sin

        if cache is not None:  # the cache receives the latent and the rotated rope key, nothing else
            latent, k_rope = cache.update(latent, k_rope, self.layer_idx)
        kv_len = latent.size(-2)
        mask, causal = _attention_mask(attention_mask, q_len, kv_len, hidden_states.device)
        c_k, c_v = self._latents(latent)  # [B, 1, S, r_K], [B, 1, S, r_V]

        if self.absorb:
            # Query heads as (group, head in group), so each group's up-projection block is used in place.
            by_group = (bsz, self.num_kv_heads, self.num_heads // self.num_kv_heads, q_len)
            q_latent = torch.einsum("bgntd,gdr->bgntr", q.view(*by_group, self.head_dim), self._grouped(self.k_up, self.k_rank))
            q_latent = q_latent.reshape(bsz, self.num_heads, q_len, self.k_rank)
            if q_len == 1:  # decoding (the hot path is `_fused_decode`): reads the cached latent and rope key in place
                rows = (t.squeeze(2) for t in (q_latent, q_rope))
                cached = (t.squeeze(1) for t in (c_k, k_rope, c_v))
                out = _single_head_decode(*rows, *cached, None if mask is None else mask[:, :, -1], self.scaling).unsqueeze(2)
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

    def _fused_decode(self, x: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor], attention_mask: torch.Tensor | None, cache) -> torch.Tensor:
        """`forward` of one absorbed decoding step without autograd, x [B, 1, D] -> [B, 1, D], from `FusedWeights`.

        33 top-level ops per layer against the parameter path's 53 (SmolLM2, batch 1; GQA's layer has 36): between
        the MLPs' weight streams each small op costs a few us, which at batch 1 is what decides against GQA."""
        fused = self.fused_weights()
        bsz, heads, rope_dims = x.size(0), self.num_heads, self.rope_dims
        q, latent, rope = torch.matmul(x, fused.input_t).split(fused.splits, dim=-1)  # pre-scaled q and rope query
        rope = rope.view(bsz, 1, heads + 1, rope_dims)  # [B, 1, n_h + 1, 2k]: every query head's rope dims and the key's
        rope_index = self._buffers["rope_index"]  # a dict lookup: nn.Module.__getattr__ costs ~1 us per call
        cos, signed_sin = _kept_rope_tables(position_embeddings, rope_index, self._rope_key, fused=True)
        # rotate_half(r) * sin == roll(r, k) * [-sin_1 | sin_2]: one copy instead of slicing, negating and concatenating
        rope = torch.addcmul(rope * cos, rope.roll(rope_dims // 2, dims=-1), signed_sin)
        latent, k_rope = latent.unsqueeze(1), rope[:, :, heads:]  # [B, 1, 1, r]: one pseudo-head, one position
        if cache is not None:
            latent, k_rope = cache.update(latent, k_rope, self.layer_idx)
        c_k, c_v = self._latents(latent[:, 0])  # [B, S, r_K], [B, S, r_V], read in place
        mask = None if attention_mask is None else attention_mask[:, :, -1, : c_k.size(1)]  # [B, 1 or n_h, S]
        q_latent = _grouped_matmul(q, fused.k_up, heads)  # [B, n_h, r_K]
        out = _single_head_decode(q_latent, rope[:, 0, :heads], c_k, k_rope[:, 0], c_v, mask, 1.0)  # [B, n_h, r_V]
        return torch.matmul(_grouped_matmul(out, fused.v_up_t, heads).view(bsz, 1, -1), fused.output_t)

    def fused_weights(self) -> FusedWeights:
        """This layer's `FusedWeights`, rebuilt first if a parameter they come from has changed since."""
        # Plain dict lookups, not `self.q_proj.weight`: nn.Module.__getattr__ costs ~1 us per name, per layer and step.
        params = tuple(self._modules[name]._parameters["weight"] for name in _FUSED_SOURCES)
        steps = _OptimizerSteps.now()
        fused = self._fused
        if fused is None or not fused.matches(params, steps):
            fused = self._fused = self._build_fused(params, steps)
        return fused

    def drop_fused_weights(self) -> None:
        """Forget the fused copies (after writing parameters through `.data`, which nothing can detect)."""
        self._fused = None

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> MLAAttention:
        self._fused = None  # .to() / .double() replace the parameters: don't keep the old data alive in the copies
        return super()._apply(fn, recurse)

    def _build_fused(self, params: tuple[torch.Tensor, ...], optimizer_steps: int) -> FusedWeights:
        w_q, w_q_rope, w_kv_a, w_k_up, w_v_up, w_o = params
        latent, g, dh = self.latent_rank, self.num_kv_heads, self.head_dim
        with torch.no_grad():
            rows = torch.cat([w_q * self.scaling, w_kv_a[:latent], w_q_rope * self.scaling, w_kv_a[latent:]])
            splits = (w_q.size(0), latent, w_q_rope.size(0) + self.rope_dims)
            return FusedWeights(
                rows.t().contiguous(), w_o.t().contiguous(), w_k_up.detach().view(g, dh, self.k_rank),
                w_v_up.detach().view(g, dh, self.v_rank).transpose(1, 2), splits,
                tuple((p.detach(), p._version) for p in params), optimizer_steps)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}/{self.num_kv_heads}, head_dim={self.head_dim}, k_rank={self.k_rank}, v_rank={self.v_rank}, joint={self.joint}, rope_dims={self.rope_dims}, absorb={self.absorb}"


def _grouped_matmul(x: torch.Tensor, weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Every head's vector times its KV group's block: x [B, 1, n_h * a] or [B, n_h, a] (heads group-major,
    h = j * n_rep + i), weight [g, a, b] -> [B, n_h, b]. One bmm over the g groups; at B = 1 no copy at all."""
    groups, width, out = weight.shape
    bsz, rep = x.size(0), heads // groups
    if bsz == 1:
        return torch.bmm(x.reshape(groups, rep, width), weight).view(1, heads, out)
    rows = x.reshape(bsz, groups, rep, width).transpose(0, 1).reshape(groups, bsz * rep, width)
    return torch.bmm(rows, weight).view(groups, bsz, rep, out).transpose(0, 1).reshape(bsz, heads, out)


def _single_head_decode(
    q_latent: torch.Tensor, q_rope: torch.Tensor, c_k: torch.Tensor, k_rope: torch.Tensor, c_v: torch.Tensor,
    mask: torch.Tensor | None, scale: float,
) -> torch.Tensor:
    """One decoding step against the shared latent head.

    q_latent [B, n_h, r_K], q_rope [B, n_h, 2k]; the cache's c_k [B, S, r_K], k_rope [B, S, 2k], c_v [B, S, r_V]
    (views, read in place); mask None, bool (True = attend) or additive, [B, 1 or n_h, S]; scale 1.0 skips the
    multiply (the fused weights carry it). -> [B, n_h, r_V].

    The n_h query heads become n_h query rows of the single latent head, and the scores are the sum of the latent
    and the rope products, so the S cached entries are read once and never copied. SDPA with enable_gqa would
    broadcast the cache to every head, and concatenating [c_k | k_rope] copies it; on CPU at S = 2048 (SmolLM2 shapes)
    that cost 11 ms and 0.9 ms per layer and step against 0.18 ms here.
    """
    scores = torch.baddbmm(torch.bmm(q_rope, k_rope.transpose(1, 2)), q_latent, c_k.transpose(1, 2))  # [B, n_h, S]
    if scale != 1.0:
        scores.mul_(scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    if scores.dtype in (torch.float16, torch.bfloat16):  # softmax in float32, never narrower than the inputs
        return torch.bmm(scores.softmax(dim=-1, dtype=torch.float32).to(c_v.dtype), c_v)
    return torch.bmm(scores.softmax(dim=-1), c_v)


# The last (cos, sin) pair a layer received and its kept columns, per table layout: every layer of a forward gets
# the same position_embeddings and (one global pair selection) keeps the same columns, so the gather runs once per
# forward instead of once per layer. Keyed by the tensors' identity (held here, so an id cannot be reused) and the
# columns.
_ROPE_TABLES: dict[bool, tuple] = {}


def _kept_rope_tables(position_embeddings: tuple[torch.Tensor, torch.Tensor], rope_index: torch.Tensor, key: tuple[int, ...], fused: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept pairs' cos and sin [B, 1, T, 2k] out of the model's (cos, sin) [B, T, dh]; with `fused`, cos and
    the signed sin [-sin_1 | sin_2] as [B, T, 1, 2k] (the layout and the roll-based rotation of `_fused_decode`)."""
    cos, sin = position_embeddings
    last = _ROPE_TABLES.get(fused)
    if last is not None and last[0] is cos and last[1] is sin and last[2] == key:
        return last[3], last[4]
    kept_cos, kept_sin = cos[..., rope_index], sin[..., rope_index]  # [B, T, 2k]
    if fused:
        half = kept_sin.size(-1) // 2
        tables = kept_cos.unsqueeze(2), torch.cat([-kept_sin[..., :half], kept_sin[..., half:]], dim=-1).unsqueeze(2)
    else:
        tables = kept_cos.unsqueeze(1), kept_sin.unsqueeze(1)
    _ROPE_TABLES[fused] = (cos, sin, key, *tables)
    return tables


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
