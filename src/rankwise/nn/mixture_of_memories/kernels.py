"""The decayed linear-attention update in its two forms: chunked (parallel inside a chunk) and recurrent.

One memory S [dk, dv] per (batch, head), updated and read at every step t:

    S_t = exp(a_t) * S_{t-1} + k_t^T v_t        (a_t <= 0 is the log-decay of step t; a_t = 0: no decay)
    o_t = q_t S_t

A step with k_t = 0 and a_t = 0 leaves the memory unchanged: that is how a mixture of memories skips the tokens not
routed to a memory (see `layer.py`). No scale and no normaliser are applied (q and k come L2-normalised from the
projections, and the layer normalises the read-out).

Shapes: q, k [batch, heads, seq, dk]; v [batch, heads, seq, dv]; log_decay [batch, heads, seq] or None;
state [batch, heads, dk, dv]. Both forms return (o [batch, heads, seq, dv], final state).
"""

from __future__ import annotations

import torch


def _zero_state(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])


def linear_attention_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor | None = None,
                             chunk_size: int | None = None,
                             initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The update over chunks of `chunk_size` steps (None: one chunk = the fully parallel O(L^2) form).

    Inside a chunk the outputs are a masked, decayed [C, C] attention product; between chunks only the state
    [dk, dv] is carried, so the cost is O(L C dk + L dk dv) per head: linear in the sequence length.
    """
    L = q.shape[2]
    C = L if chunk_size is None else max(1, min(int(chunk_size), L))
    state = _zero_state(q, v) if initial_state is None else initial_state
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    outs = []
    for start in range(0, L, C):
        sl = slice(start, min(start + C, L))
        qc, kc, vc = q[:, :, sl], k[:, :, sl], v[:, :, sl]
        n = qc.shape[2]
        mask = causal[:n, :n]
        scores = qc @ kc.transpose(-1, -2)  # [B, H, n, n]
        if log_decay is None:
            outs.append(qc @ state + scores.masked_fill(~mask, 0.0) @ vc)
            state = state + kc.transpose(-1, -2) @ vc
            continue
        b = log_decay[:, :, sl].cumsum(-1)  # [B, H, n], inclusive: b_t = sum of a_s for s <= t in this chunk
        # exp(b_t - b_s) for s <= t is <= 1; masking the upper triangle to -inf before exp keeps it from overflowing.
        rel = (b.unsqueeze(-1) - b.unsqueeze(-2)).masked_fill(~mask, float("-inf")).exp()
        outs.append((qc * b.exp().unsqueeze(-1)) @ state + (scores * rel) @ vc)
        to_end = (b[..., -1:] - b).exp().unsqueeze(-1)  # decay from each step to the chunk's end
        state = state * b[..., -1].exp()[..., None, None] + (kc * to_end).transpose(-1, -2) @ vc
    return torch.cat(outs, dim=2), state


def linear_attention_step(q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, log_decay_t: torch.Tensor | None,
                          state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step: q_t, k_t [batch, heads, dk], v_t [batch, heads, dv], log_decay_t [batch, heads] or None,
    state [batch, heads, dk, dv] -> (o_t [batch, heads, dv], new state)."""
    if log_decay_t is not None:
        state = state * log_decay_t.exp()[..., None, None]
    state = state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
    return (q_t.unsqueeze(-2) @ state).squeeze(-2), state


def linear_attention_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor | None = None,
                               initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The update one step at a time (the reference the chunked form is checked against; O(L dk dv) per head)."""
    state = _zero_state(q, v) if initial_state is None else initial_state
    outs = []
    for t in range(q.shape[2]):
        a_t = None if log_decay is None else log_decay[:, :, t]
        o_t, state = linear_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], a_t, state)
        outs.append(o_t)
    return torch.stack(outs, dim=2), state


__all__ = ["linear_attention_chunked", "linear_attention_recurrent", "linear_attention_step"]
