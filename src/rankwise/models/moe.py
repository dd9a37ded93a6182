"""A small mixture-of-experts causal language model over UTF-8 bytes (Qwen3-MoE / Mixtral layout), and byte windows.

The testbed of MoE compression methods (CodeQuant) that need fp32 weights trained here: SmolLM2's weights come
from a 4-bit GGUF and already sit on a 4-bit grid. `rankwise.models.moe_pretrain.pretrained_moe` trains it.

    model = TinyMoELM(MoEConfig())                      # byte vocabulary 256, d 128, 2 layers, 8 experts, top-2
    logits = model(byte_windows(texts, 256))            # [W, 256] -> [W, 256, 256]
    model.aux_loss()                                     # the last forward's load-balancing loss (a scalar)

Attribute names follow Qwen3-MoE / Llama, so code that walks those models walks this one:
`model.model.embed_tokens`, `model.model.layers[i].{input_layernorm, self_attn.{q,k,v,o}_proj,
post_attention_layernorm, mlp.{gate, experts[e].{gate_proj, up_proj, down_proj}, top_k}}`, `model.model.norm`,
`model.lm_head` (untied). Every weight is an nn.Linear / nn.Embedding in torch's [out, in] layout, without biases.
There is deliberately no `.config` attribute (rankwise.eval.perplexity.logits_of would treat the model as a
transformers model); the settings are `model.moe_config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.errors import InvalidInputError

SEPARATOR = 0  # the byte after every article in byte_windows (UTF-8 text of real articles never holds NUL)


@dataclass(frozen=True)
class MoEConfig:
    """The architecture. Defaults: the CodeQuant card's toy MoE (byte vocabulary, d 128, 2 layers, 4 heads, 8 SwiGLU
    experts of hidden 256, top-2 routing, trained at context 256)."""

    vocab_size: int = 256
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_experts: int = 8
    top_k: int = 2
    expert_hidden_size: int = 256
    max_seq_len: int = 256  # the training context (RoPE itself does not limit the length)
    rope_theta: float = 1e4
    rms_norm_eps: float = 1e-5
    init_std: float = 0.02  # every weight ~ N(0, init_std^2), as Llama / Qwen initialise

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_experts", "top_k",
                     "expert_hidden_size", "max_seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"MoEConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise InvalidInputError(f"hidden_size {self.hidden_size} must split into {self.num_heads} heads of an even "
                                    "width (RoPE rotates pairs of channels)")
        if self.top_k > self.num_experts:
            raise InvalidInputError(f"top_k {self.top_k} exceeds the {self.num_experts} experts")
        if not (self.rope_theta > 1 and self.rms_norm_eps > 0 and self.init_std > 0):
            raise InvalidInputError("rope_theta must be > 1, rms_norm_eps and init_std > 0")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding of x [B, H, T, Dh] (the rotate-half convention of Llama / Qwen / HF): channel i is
    paired with i + Dh/2 and rotated by angle t * theta^(-2i/Dh) at position t."""
    t, dh = x.shape[-2], x.shape[-1]
    # angles in float64 so float32 and float64 models see the same rotation up to their own rounding
    inv_freq = theta ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    angles = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)  # [T, Dh/2]
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : dh // 2], x[..., dh // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Causal multi-head attention, RoPE on q and k after their projections: [B, T, d] -> [B, T, d]."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.num_heads, self.rope_theta = config.num_heads, config.rope_theta
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.num_heads, d // self.num_heads).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # each [B, H, T, Dh]
        q, k = rope(q, self.rope_theta), rope(k, self.rope_theta)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, d))


class Expert(nn.Module):
    """A SwiGLU feed-forward expert: down_proj(silu(gate_proj(x)) * up_proj(x)), [N, d] -> [N, d]."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoE(nn.Module):
    """Top-k routed experts: [B, T, d] -> [B, T, d].

    `gate` (the router, nn.Linear d -> E) gives the router logits; softmax over the E experts, the top_k largest
    probabilities renormalised to sum 1 (Qwen3's norm_topk_prob, Mixtral); output = sum_k w_k expert_k(x). Each expert
    runs only on the tokens routed to it (index_select / index_add_). After each forward, `last_aux_loss` is the
    Switch load-balancing loss E * sum_e f_e p_e (f_e: the share of the N * top_k assignments that went to expert e,
    p_e: its mean router probability; 1.0 at perfectly uniform routing) and `last_counts` int64 [E] the assignments
    per expert."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.num_experts, self.top_k = config.num_experts, config.top_k
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(config.hidden_size, config.expert_hidden_size) for _ in range(config.num_experts))
        self.last_aux_loss: torch.Tensor | None = None
        self.last_counts: torch.Tensor | None = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For tokens x [N, d]: (weights [N, k] summing to 1 per token, expert indices int64 [N, k] (distinct per
        token, by decreasing probability), router probabilities [N, E])."""
        probs = torch.softmax(self.gate(x), dim=-1)
        top, indices = probs.topk(self.top_k, dim=-1)
        return top / top.sum(dim=-1, keepdim=True), indices, probs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, indices, probs = self.route(flat)
        out = torch.zeros_like(flat)
        counts = torch.zeros(self.num_experts, dtype=torch.int64)
        for e, expert in enumerate(self.experts):
            token, slot = (indices == e).nonzero(as_tuple=True)  # each token at most once: its top-k are distinct
            counts[e] = token.numel()
            if token.numel() == 0:
                continue
            y = expert(flat.index_select(0, token)) * weights[token, slot].unsqueeze(-1)
            out.index_add_(0, token, y)
        share = counts.to(probs.dtype) / indices.numel()
        self.last_aux_loss = self.num_experts * (share * probs.mean(dim=0)).sum()
        self.last_counts = counts
        return out.view(shape)


class DecoderLayer(nn.Module):
    """Pre-norm block: x + self_attn(input_layernorm(x)), then + mlp(post_attention_layernorm(x))."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = SparseMoE(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class MoEBackbone(nn.Module):
    """embed_tokens, layers, norm: input_ids [B, T] -> final hidden states [B, T, d]."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


class TinyMoELM(nn.Module):
    """The MoE causal LM: input_ids int64 [B, T] (bytes 0..vocab_size-1) -> logits [B, T, vocab_size].

    Initialised from the global RNG (seed it, or build through a recipe); settings in `moe_config`."""

    def __init__(self, config: MoEConfig | None = None) -> None:
        super().__init__()
        config = config or MoEConfig()
        self.moe_config = config
        self.model = MoEBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=config.init_std)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.int64 or input_ids.dim() != 2:
            got = f"{input_ids.dtype} {tuple(input_ids.shape)}" if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise InvalidInputError(f"TinyMoELM takes input_ids int64 [B, T], got {got}")
        if input_ids.numel() == 0:
            raise InvalidInputError(f"input_ids is empty ({tuple(input_ids.shape)})")
        vocab = self.moe_config.vocab_size
        if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
            raise InvalidInputError(f"input_ids must lie in [0, {vocab}), got [{int(input_ids.min())}, {int(input_ids.max())}]")
        return self.lm_head(self.model(input_ids))

    def moe_layers(self) -> list[SparseMoE]:
        return [layer.mlp for layer in self.model.layers]

    def aux_loss(self) -> torch.Tensor:
        """The last forward's load-balancing loss, averaged over the layers (a scalar; 1.0 when routing is uniform)."""
        losses = [moe.last_aux_loss for moe in self.moe_layers()]
        if any(loss is None for loss in losses):
            raise InvalidInputError("aux_loss() reads the last forward's routing: run the model on some input first")
        return torch.stack(losses).mean()


# ------------------------------------------------------------------------------------------------------ bytes


def byte_encode(text: str) -> torch.Tensor:
    """The UTF-8 bytes of `text` as int64 [len(text.encode())]."""
    if not isinstance(text, str):
        raise InvalidInputError(f"byte_encode takes a str, got {type(text).__name__}")
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.int64)


def byte_windows(texts: Sequence[str], seq_len: int, max_windows: int | None = None) -> torch.Tensor:
    """Non-overlapping windows int64 [W, seq_len] of the stream text_0 bytes, 0, text_1 bytes, 0, ... (each text's
    UTF-8 bytes followed by one separator byte 0), cut from its start; the incomplete tail is dropped. With
    `max_windows`, only the first max_windows windows (and only the texts they need are encoded)."""
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise InvalidInputError(f"byte_windows takes a sequence of texts (a list of str), got {type(texts).__name__}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise InvalidInputError(f"seq_len must be an integer >= 2 (a window predicts its next bytes), got {seq_len!r}")
    if max_windows is not None and (isinstance(max_windows, bool) or not isinstance(max_windows, int) or max_windows < 1):
        raise InvalidInputError(f"max_windows must be a positive integer or None, got {max_windows!r}")
    if len(texts) == 0:
        raise InvalidInputError("byte_windows got no texts")
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text:
            raise InvalidInputError(f"text {i} is {'empty' if isinstance(text, str) else type(text).__name__}: "
                                    "byte_windows takes non-empty str")
        if "\x00" in text:
            raise InvalidInputError(f"text {i} holds a NUL character, the separator byte_windows puts between texts")
    need = None if max_windows is None else max_windows * seq_len
    stream, size = bytearray(), 0
    for text in texts:
        stream += text.encode("utf-8")
        stream.append(SEPARATOR)
        size = len(stream)
        if need is not None and size >= need:
            break
    count = size // seq_len if max_windows is None else min(size // seq_len, max_windows)
    if count == 0:
        raise InvalidInputError(f"the texts hold {size} bytes (with separators), fewer than one window of {seq_len}")
    data = torch.frombuffer(stream, dtype=torch.uint8)[: count * seq_len]
    return data.to(torch.int64).view(count, seq_len)
