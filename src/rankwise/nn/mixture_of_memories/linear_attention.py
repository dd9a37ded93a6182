"""Single-memory linear attention: the base layer Mixture-of-Memories builds on, and its reusable parts.

    q_t = l2norm(SiLU(conv(x W_q)))   k_t = l2norm(SiLU(conv(x W_k)))   v_t = SiLU(conv(x W_v))     (per head)
    S_t = gamma_h S_{t-1} + k_t^T v_t,  o_t = q_t S_t,  y_t = W_o concat_h RMSNorm(o_t)

with a fixed per-head decay gamma_h (1 = plain linear attention; "retnet" = 1 - 2^(-5-h)). The parts — a projection
to heads (`HeadProjection`), a key/value pair (`KeyValue`) and the normalised read-out (`ReadOut`) — are what
`MixtureOfMemories` reuses: with one memory, top-1 and no shared memory it is exactly this layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.nn.mixture_of_memories.checks import check_mode, check_sequence, positive_int
from rankwise.nn.mixture_of_memories.kernels import linear_attention_chunked, linear_attention_step
from rankwise.nn.mixture_of_memories.short_conv import ShortConv

State = dict[str, torch.Tensor]


class HeadProjection(nn.Module):
    """x [batch, seq, d_model] -> [batch, heads, seq, head_dim]: linear map, causal short conv, SiLU, L2 norm.

    conv_size 0 drops the convolution; `activation` / `l2norm` False drop those steps (a softmax attention's q, k).
    """

    def __init__(self, d_model: int, heads: int, head_dim: int, conv_size: int, activation: bool = True,
                 l2norm: bool = False) -> None:
        super().__init__()
        self.heads, self.head_dim, self.activation, self.l2norm = heads, head_dim, activation, l2norm
        self.linear = nn.Linear(d_model, heads * head_dim, bias=False)
        self.conv = ShortConv(heads * head_dim, conv_size) if conv_size > 0 else None

    def _finish(self, h: torch.Tensor) -> torch.Tensor:  # [..., heads * head_dim] -> [..., heads, head_dim]
        h = h.unflatten(-1, (self.heads, self.head_dim))
        if self.activation:
            h = F.silu(h)
        return F.normalize(h, dim=-1, eps=1e-6) if self.l2norm else h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        if self.conv is not None:
            h = self.conv(h)
        return self._finish(h).transpose(1, 2)

    def init_cache(self, batch: int, like: torch.Tensor) -> torch.Tensor:
        return self.conv.init_cache(batch, like) if self.conv is not None else like.new_zeros(batch, 0, 0)

    def step(self, x_t: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x_t [batch, d_model] -> ([batch, heads, head_dim], new conv cache)."""
        h = self.linear(x_t)
        if self.conv is not None:
            h, cache = self.conv.step(h, cache)
        return self._finish(h), cache


class KeyValue(nn.Module):
    """One memory's write path: keys [batch, heads, seq, dk] (L2-normalised) and values [batch, heads, seq, dv]."""

    def __init__(self, d_model: int, heads: int, key_dim: int, value_dim: int, conv_size: int) -> None:
        super().__init__()
        self.k = HeadProjection(d_model, heads, key_dim, conv_size, l2norm=True)
        self.v = HeadProjection(d_model, heads, value_dim, conv_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k(x), self.v(x)


class ReadOut(nn.Module):
    """o [batch, heads, seq, dv] -> [batch, seq, d_model]: RMSNorm per head (one weight shared by heads), W_o."""

    def __init__(self, heads: int, value_dim: int, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(value_dim, eps=eps)
        self.out = nn.Linear(heads * value_dim, d_model, bias=False)

    def forward(self, o: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(o.transpose(1, 2)).flatten(-2))

    def step(self, o_t: torch.Tensor) -> torch.Tensor:
        """o_t [batch, heads, dv] -> [batch, d_model]."""
        return self.out(self.norm(o_t).flatten(-2))


def head_log_decay(decay: str | float | Sequence[float] | None, heads: int) -> torch.Tensor | None:
    """log gamma [heads] from None (no decay), "retnet" (1 - 2^(-5-h)), one gamma, or one gamma per head."""
    if decay is None:
        return None
    if decay == "retnet":
        gammas = [1.0 - 2.0 ** (-5 - h) for h in range(heads)]
    elif isinstance(decay, (int, float)):
        gammas = [float(decay)] * heads
    else:
        gammas = [float(g) for g in decay]
    if len(gammas) != heads or not all(0.0 < g <= 1.0 for g in gammas):
        raise InvalidInputError(f"decay must be None, 'retnet', or gammas in (0, 1] (one or one per head for "
                                f"{heads} heads), got {decay!r}")
    return torch.tensor(gammas).log()


class LinearAttention(nn.Module):
    """Single-memory (decayed) linear attention, a causal token mixer: x [batch, seq, d_model] -> [batch, seq, d_model].

    Args:
        d_model: model width.  num_heads: heads.  key_dim, value_dim: per-head dk, dv (default d_model / num_heads).
        conv_size: short-convolution taps (0: none).  decay: see `head_log_decay`.
        chunk_size: chunk length of the parallel form (None: one chunk, the O(L^2) form).
    `forward(x, mode="recurrent")` runs `step` token by token (the inference form); both modes give the same output.
    """

    def __init__(self, d_model: int, num_heads: int = 2, key_dim: int | None = None, value_dim: int | None = None,
                 conv_size: int = 4, decay: str | float | Sequence[float] | None = None,
                 chunk_size: int | None = 64) -> None:
        super().__init__()
        self.d_model, self.num_heads = positive_int(d_model, "d_model"), positive_int(num_heads, "num_heads")
        self.key_dim = positive_int(key_dim if key_dim is not None else d_model // num_heads, "key_dim")
        self.value_dim = positive_int(value_dim if value_dim is not None else d_model // num_heads, "value_dim")
        if isinstance(conv_size, bool) or not isinstance(conv_size, int) or conv_size < 0:
            raise InvalidInputError(f"conv_size must be an int >= 0, got {conv_size!r}")
        self.chunk_size = None if chunk_size is None else positive_int(chunk_size, "chunk_size")
        self.q = HeadProjection(d_model, num_heads, self.key_dim, conv_size, l2norm=True)
        self.kv = KeyValue(d_model, num_heads, self.key_dim, self.value_dim, conv_size)
        self.readout = ReadOut(num_heads, self.value_dim, d_model)
        log_gamma = head_log_decay(decay, num_heads)
        self.register_buffer("log_gamma", log_gamma if log_gamma is not None else torch.zeros(0), persistent=True)

    def _log_decay(self, like: torch.Tensor, batch: int, seq: int) -> torch.Tensor | None:
        if self.log_gamma.numel() == 0:
            return None
        return self.log_gamma.to(like.dtype)[None, :, None].expand(batch, -1, seq)

    def forward(self, x: torch.Tensor, mode: str = "chunked") -> torch.Tensor:
        """x [batch, seq, d_model] -> [batch, seq, d_model]."""
        check_sequence(x, self.d_model, type(self).__name__)
        if check_mode(mode, type(self).__name__) == "recurrent":
            return run_recurrent(self, x)
        k, v = self.kv(x)
        o, _ = linear_attention_chunked(self.q(x), k, v, self._log_decay(x, x.shape[0], x.shape[1]), self.chunk_size)
        return self.readout(o)

    def init_state(self, batch: int, like: torch.Tensor) -> State:
        """The recurrent state before the first token: conv caches and the memory S [batch, heads, dk, dv]."""
        return {"q": self.q.init_cache(batch, like), "k": self.kv.k.init_cache(batch, like),
                "v": self.kv.v.init_cache(batch, like),
                "S": like.new_zeros(batch, self.num_heads, self.key_dim, self.value_dim)}

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One token: x_t [batch, d_model] -> (y_t [batch, d_model], new state)."""
        q_t, cq = self.q.step(x_t, state["q"])
        k_t, ck = self.kv.k.step(x_t, state["k"])
        v_t, cv = self.kv.v.step(x_t, state["v"])
        a_t = self._log_decay(x_t, x_t.shape[0], 1)
        o_t, S = linear_attention_step(q_t, k_t, v_t, None if a_t is None else a_t[..., 0], state["S"])
        return self.readout.step(o_t), {"q": cq, "k": ck, "v": cv, "S": S}


def run_recurrent(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Feed x [batch, seq, d_model] to `layer.step` one token at a time -> [batch, seq, d_model]."""
    state = layer.init_state(x.shape[0], x)
    ys = []
    for t in range(x.shape[1]):
        y_t, state = layer.step(x[:, t], state)
        ys.append(y_t)
    return torch.stack(ys, dim=1)


__all__ = ["HeadProjection", "KeyValue", "LinearAttention", "ReadOut", "head_log_decay", "run_recurrent"]
