"""The tiled (FA2, online-softmax) attention forward and backward, with the rounding points of a bf16 kernel.

Forward, per query tile, over its key tiles (card notation, α = 1/sqrt(d)):
    S = r(QKᵀα); m_t = rowmax(S) (the fix may shift it); m_new = max(m_old, m_t); P̄ = r(exp(S - m_new))
    ℓ ← e^{m_old - m_new} ℓ + rowsum(P̄)        (fp32)
    O ← r_acc(e^{m_old - m_new} O + r_acc(P̄V))  (P̄V accumulated in fp32, then rounded: where the bias is born)
    O ← r_out(O / ℓ); lse = m + log ℓ
Backward (FA2): P = exp(S - lse); dV = PᵀdO; dP = dO Vᵀ; δ = rowsum(dO ∘ O); dS = P ∘ (dP - δ) α; dQ = dS K; dK = dSᵀQ,
computed in fp32 from the saved (rounded) operands and output: the error of the bf16 O reaches the weights through δ.
`r` is `rounding.bf16_round` in emulated bf16 and the identity in exact arithmetic.

Shapes: q [..., Tq, D], k and v [..., Tk, D] (leading dims shared, e.g. [B, H]); out [..., Tq, D], lse [..., Tq].
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rankwise.nn.lowprec_flash_attention.config import FlashConfig
from rankwise.nn.lowprec_flash_attention.rounding import bf16_round, bf16_round_stochastic, identity

Round = Callable[[torch.Tensor], torch.Tensor]
ScoreTile = Callable[[int, int, int, int], torch.Tensor]  # (i0, i1, j0, j1) -> scaled, rounded, masked S tile


@dataclass(frozen=True)
class Rounders:
    inputs: Round  # q, k, v, dO, S and P̄
    accumulate: Round  # each tile's P̄V and the running O
    output: Round  # the final O


def rounders(cfg: FlashConfig, generator: torch.Generator | None = None) -> Rounders:
    if not cfg.emulated:
        return Rounders(identity, identity, identity)
    out = bf16_round if cfg.rounding == "nearest" else functools.partial(bf16_round_stochastic, generator=generator)
    return Rounders(bf16_round, identity if cfg.accumulation == "fp32" else out, out)


def fixed_row_max(s: torch.Tensor, cfg: FlashConfig) -> torch.Tensor:
    """The row max of a score tile [..., tq, tk] the online softmax subtracts: rowmax(S), and with the fix, for rows
    with more than one score within `tie_tol` of it, β·max (max > 0) or 0 (max < 0). -> [..., tq]"""
    m = s.amax(-1)
    if not cfg.fix:
        return m
    ties = (s >= (m - cfg.tie_tol).unsqueeze(-1)).sum(-1)
    tied = (ties > 1) & torch.isfinite(m)
    return torch.where(tied & (m > 0), cfg.beta * m, torch.where(tied & (m < 0), torch.zeros_like(m), m))


def _visible(i0: int, i1: int, j0: int, cfg: FlashConfig, offset: int) -> bool:
    return not cfg.causal or j0 <= i1 - 1 + offset


def _mask(s: torch.Tensor, i0: int, i1: int, j0: int, j1: int, offset: int) -> torch.Tensor:
    i = torch.arange(i0, i1, device=s.device).unsqueeze(-1)
    j = torch.arange(j0, j1, device=s.device)
    return s.masked_fill(j > i + offset, float("-inf"))


def forward_from_scores(score: ScoreTile, v: torch.Tensor, tq: int, cfg: FlashConfig, r: Rounders
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward on scores given tile by tile (already scaled, rounded and masked). v [..., Tk, D] (rounded).
    -> (O [..., Tq, D] after the output rounding, lse [..., Tq], O before it [..., Tq, D], ℓ [..., Tq])."""
    tk = v.shape[-2]
    offset = tk - tq
    outs, lses, raws, rowsums = [], [], [], []
    for i0 in range(0, tq, cfg.tile_q):
        i1 = min(i0 + cfg.tile_q, tq)
        lead = v.shape[:-2]
        m = torch.full((*lead, i1 - i0), float("-inf"), dtype=v.dtype, device=v.device)
        ell = torch.zeros_like(m)
        o = torch.zeros(*lead, i1 - i0, v.shape[-1], dtype=v.dtype, device=v.device)
        for j0 in range(0, tk, cfg.tile_k):
            if not _visible(i0, i1, j0, cfg, offset):
                break
            j1 = min(j0 + cfg.tile_k, tk)
            s = score(i0, i1, j0, j1)
            m_new = torch.maximum(m, fixed_row_max(s, cfg))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # a row with nothing visible yet
            p = r.inputs(torch.exp(s - m_safe.unsqueeze(-1)))
            corr = torch.exp(m - m_safe)
            ell = corr * ell + p.sum(-1)
            o = r.accumulate(corr.unsqueeze(-1) * o + r.accumulate(p @ v[..., j0:j1, :]))
            m = m_new
        ell = ell.clamp_min(cfg.min_rowsum)
        raw = o / ell.unsqueeze(-1)
        outs.append(r.output(raw))
        raws.append(raw)
        lses.append(m + torch.log(ell))
        rowsums.append(ell)
    return torch.cat(outs, -2), torch.cat(lses, -1), torch.cat(raws, -2), torch.cat(rowsums, -1)


def _score_fn(q: torch.Tensor, k: torch.Tensor, cfg: FlashConfig, r: Rounders) -> ScoreTile:
    alpha = 1.0 / math.sqrt(q.shape[-1])
    offset = k.shape[-2] - q.shape[-2]

    def score(i0: int, i1: int, j0: int, j1: int) -> torch.Tensor:
        s = r.inputs((q[..., i0:i1, :] @ k[..., j0:j1, :].transpose(-1, -2)) * alpha)
        return _mask(s, i0, i1, j0, j1, offset) if cfg.causal else s
    return score


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: FlashConfig,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [..., Tq, D], k, v [..., Tk, D] in the compute dtype (fp32 for bf16 emulation), already input-rounded.
    -> (O [..., Tq, D], lse [..., Tq], the O that δ reads: the output itself, or the fp32 one with fp32 accumulation)."""
    r = rounders(cfg, generator)
    out, lse, raw, _ = forward_from_scores(_score_fn(q, k, cfg, r), v, q.shape[-2], cfg, r)
    return out, lse, raw if cfg.emulated and cfg.accumulation == "fp32" else out


def flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                   do: torch.Tensor, cfg: FlashConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The FA2 backward in the compute dtype. q [..., Tq, D], k, v [..., Tk, D], o [..., Tq, D] (what δ reads),
    lse [..., Tq], do [..., Tq, D]. -> (dQ, dK, dV) of the shapes of q, k, v."""
    r = rounders(cfg)
    do = r.inputs(do)
    alpha = 1.0 / math.sqrt(q.shape[-1])
    score = _score_fn(q, k, cfg, r)
    tq, tk = q.shape[-2], k.shape[-2]
    offset = tk - tq
    delta = (do * o).sum(-1)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i0 in range(0, tq, cfg.tile_q):
        i1 = min(i0 + cfg.tile_q, tq)
        for j0 in range(0, tk, cfg.tile_k):
            if not _visible(i0, i1, j0, cfg, offset):
                break
            j1 = min(j0 + cfg.tile_k, tk)
            p = torch.exp(score(i0, i1, j0, j1) - lse[..., i0:i1].unsqueeze(-1))
            do_t = do[..., i0:i1, :]
            dv[..., j0:j1, :] += p.transpose(-1, -2) @ do_t
            dp = do_t @ v[..., j0:j1, :].transpose(-1, -2)
            ds = p * (dp - delta[..., i0:i1].unsqueeze(-1)) * alpha
            dq[..., i0:i1, :] += ds @ k[..., j0:j1, :]
            dk[..., j0:j1, :] += ds.transpose(-1, -2) @ q[..., i0:i1, :]
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd of the tiled kernel: the forward above, the FA2 backward (no autograd through the tiles). The
    input rounding of the emulated kernel passes gradients straight through."""

    @staticmethod
    def forward(ctx, q, k, v, cfg: FlashConfig, generator):  # type: ignore[override]
        dtype = torch.float32 if cfg.emulated else q.dtype
        r = rounders(cfg)
        q_, k_, v_ = (r.inputs(t.to(dtype)) for t in (q, k, v))
        out, lse, o_delta = flash_forward(q_, k_, v_, cfg, generator)
        ctx.save_for_backward(q_, k_, v_, o_delta, lse)
        ctx.cfg, ctx.dtypes = cfg, (q.dtype, k.dtype, v.dtype)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        q_, k_, v_, o_delta, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q_, k_, v_, o_delta, lse, grad_out.to(q_.dtype), ctx.cfg)
        return dq.to(ctx.dtypes[0]), dk.to(ctx.dtypes[1]), dv.to(ctx.dtypes[2]), None, None


__all__ = ["Rounders", "rounders", "fixed_row_max", "forward_from_scores", "flash_forward", "flash_backward",
           "FlashAttentionFunction"]
