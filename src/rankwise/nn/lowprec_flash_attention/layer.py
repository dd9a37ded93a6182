"""`flash_attention` (the checked entry point) and `FlashAttention` (the layer: [B, H, T, D] in, same out)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.nn.lowprec_flash_attention.config import FlashConfig
from rankwise.nn.lowprec_flash_attention.kernel import FlashAttentionFunction


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: FlashConfig) -> None:
    """Refuse, before any work, what the kernel cannot compute: not [B, H, T, D], mismatched shapes, a non-float
    dtype, NaN or inf values (skipped on the meta device, which has no values)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = t.dim() if isinstance(t, torch.Tensor) else type(t).__name__
            raise InvalidInputError(f"flash attention takes {name} as [batch, heads, seq, head_dim] (rank 4), got "
                                    f"rank {got}")
        if not t.is_floating_point():
            raise InvalidInputError(f"{name} must be floating point, got {t.dtype}")
    if k.shape != v.shape:
        raise InvalidInputError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise InvalidInputError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must share batch, heads and head_dim")
    if not (q.dtype == k.dtype == v.dtype):
        raise InvalidInputError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        raise InvalidInputError("flash attention needs at least one query and one key")
    if cfg.causal and k.shape[-2] < q.shape[-2]:
        raise InvalidInputError(f"causal attention with fewer keys ({k.shape[-2]}) than queries ({q.shape[-2]}) "
                                "leaves rows with nothing to attend to")
    if not q.is_meta:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not torch.isfinite(t).all():
                raise InvalidInputError(f"{name} has NaN or infinite values; the kernel refuses them before any work")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: FlashConfig | None = None,
                    generator: torch.Generator | None = None, **options) -> torch.Tensor:
    """Tiled attention softmax(q kᵀ / sqrt(D)) v. q [B, H, Tq, D], k, v [B, H, Tk, D] -> [B, H, Tq, D] in q's dtype.
    `config` (or its fields as keyword options) says the arithmetic; `generator` drives stochastic rounding."""
    cfg = dataclasses.replace(config or FlashConfig(), **options) if options else (config or FlashConfig())
    check_inputs(q, k, v, cfg)
    return FlashAttentionFunction.apply(q, k, v, cfg, generator)


class FlashAttention(nn.Module):
    """Flash attention over heads: (q, k, v) [B, H, T, D] -> [B, H, Tq, D].

    `qk_norm=True` adds QK-norm (an RMS norm of q and k over D with learnable gains [H, D]; the band-aid the paper
    discusses). The config's fields are options: `FlashAttention(16, precision="bf16", fix=True)`.
    """

    def __init__(self, head_dim: int, num_heads: int = 1, qk_norm: bool = False, config: FlashConfig | None = None,
                 **options) -> None:
        super().__init__()
        if not isinstance(head_dim, int) or head_dim <= 0 or not isinstance(num_heads, int) or num_heads <= 0:
            raise InvalidInputError(f"head_dim and num_heads must be positive ints, got {head_dim!r}, {num_heads!r}")
        self.config = dataclasses.replace(config or FlashConfig(), **options)
        self.head_dim, self.num_heads, self.qk_norm = head_dim, num_heads, qk_norm
        self.generator: torch.Generator | None = None  # stochastic rounding's randomness, set by the caller
        if qk_norm:
            self.q_gain = nn.Parameter(torch.ones(num_heads, head_dim))
            self.k_gain = nn.Parameter(torch.ones(num_heads, head_dim))

    def _norm(self, x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gain.unsqueeze(-2)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        check_inputs(q, k, v, self.config)
        if q.shape[-1] != self.head_dim:
            raise InvalidInputError(f"this layer has head_dim {self.head_dim}, got inputs with {q.shape[-1]}")
        if self.qk_norm:
            if q.shape[1] != self.num_heads:
                raise InvalidInputError(f"QK-norm gains are for {self.num_heads} heads, got {q.shape[1]}")
            q, k = self._norm(q, self.q_gain), self._norm(k, self.k_gain)
        return FlashAttentionFunction.apply(q, k, v, self.config, self.generator)

    def extra_repr(self) -> str:
        c = self.config
        return (f"head_dim={self.head_dim}, heads={self.num_heads}, qk_norm={self.qk_norm}, precision={c.precision}, "
                f"accumulation={c.accumulation}, rounding={c.rounding}, fix={c.fix}, beta={c.beta}, "
                f"tiles=({c.tile_q}, {c.tile_k}), causal={c.causal}")


__all__ = ["FlashAttention", "flash_attention", "check_inputs"]
