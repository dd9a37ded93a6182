"""What an interpretability user does with a fitted Lorsa: top-activating contexts of a head, induction scores of
attention patterns, and the purity of units against labelled mechanisms."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.errors import InvalidInputError
from rankwise.nn.lorsa.checks import check_sequence
from rankwise.nn.lorsa.layer import Lorsa


@dataclass(frozen=True)
class TopContext:
    """One top activation of a head: window `window`, query position `position`, activation `value` (after the
    top-K), and `source`, the key position that contributes most to it (the z-pattern's argmax)."""

    window: int
    position: int
    value: float
    source: int


@torch.no_grad()
def top_activating_contexts(lorsa: Lorsa, x: torch.Tensor, head: int, n: int = 10, skip_first: int = 1,
                            batch_size: int = 16) -> list[TopContext]:
    """The `n` (window, position) pairs where head `head` is most active, largest first. x [N, T, d] (raw units).

    Activity is the head's activation after the top-K (zero where the head is not among the K selected), ranked by
    the same magnitude the top-K uses (|z|, or z for the "relu" selection). Positions < `skip_first` are ignored.
    """
    check_sequence(x, lorsa.config.d_model)
    if not isinstance(head, int) or not 0 <= head < lorsa.config.n_ov:
        raise InvalidInputError(f"head must be in [0, {lorsa.config.n_ov}), got {head!r}")
    if n < 1:
        raise InvalidInputError(f"n must be >= 1, got {n}")
    if x.size(1) <= skip_first:
        raise InvalidInputError(f"windows of {x.size(1)} tokens leave nothing after skipping {skip_first}")
    acts = torch.cat([lorsa.sparse_activations(x[i:i + batch_size])[..., head] for i in range(0, x.size(0), batch_size)])
    acts[:, :skip_first] = 0.0
    rank = acts.abs() if lorsa.config.selection == "abs" else acts.clamp_min(0)
    flat = rank.flatten()
    order = flat.topk(min(n, int((flat > 0).sum()))).indices
    out = []
    for f in order.tolist():
        w, t = divmod(f, x.size(1))
        contrib = lorsa.z_pattern(x[w:w + 1], head)[0, t]  # [T]: source s's share of z_t
        out.append(TopContext(w, t, float(acts[w, t]), int(contrib.abs().argmax())))
    return out


def previous_occurrence(tokens: torch.Tensor) -> torch.Tensor:
    """For tokens [B, T]: the position of the most recent earlier occurrence of tokens[b, t], or -1. -> [B, T]"""
    B, T = tokens.shape
    same = tokens[:, :, None] == tokens[:, None, :]  # [B, t, s]
    earlier = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril(-1)
    pos = torch.arange(T, device=tokens.device).expand(T, T)
    cand = torch.where(same & earlier, pos, torch.full_like(pos, -1))
    return cand.max(dim=-1).values


def induction_score(patterns: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean attention from t to (previous occurrence of tokens[t]) + 1, over positions that have one.

    patterns [B, H, T, T] (rows are queries), tokens [B, T] -> [H].
    """
    if patterns.dim() != 4 or patterns.shape[-2:] != (tokens.size(1),) * 2 or patterns.size(0) != tokens.size(0):
        raise InvalidInputError(f"patterns {tuple(patterns.shape)} must be [B, H, T, T] for tokens {tuple(tokens.shape)}")
    prev = previous_occurrence(tokens)
    b, t = torch.nonzero(prev >= 0, as_tuple=True)
    if b.numel() == 0:
        raise InvalidInputError("no token repeats: an induction score needs repeated tokens (e.g. a doubled sequence)")
    return patterns[b, :, t, prev[b, t] + 1].mean(0)


def mechanism_fractions(activations: torch.Tensor, labels: torch.Tensor, n_top: int = 100) -> torch.Tensor:
    """Per unit and mechanism: the fraction of the unit's `n_top` strongest activations that carry that label.

    activations [P, U] (P positions, U units; magnitudes are ranked), labels [P] int64 (>= 0 a planted mechanism,
    < 0 none) -> [U, n_mech]. Positions where the unit is exactly zero (not selected) never count as its activations.
    """
    if activations.dim() != 2 or labels.shape != activations.shape[:1]:
        raise InvalidInputError(f"activations [P, U] and labels [P] needed, got {tuple(activations.shape)}, {tuple(labels.shape)}")
    if not (labels >= 0).any():
        raise InvalidInputError("no position carries a mechanism label (labels >= 0)")
    n_mech = int(labels.max()) + 1
    n_top = min(n_top, activations.size(0))
    mag = activations.abs()
    top = mag.topk(n_top, dim=0).indices  # [n_top, U]
    fired = mag.gather(0, top) > 0
    lab = labels[top]
    counts = torch.stack([((lab == m) & fired).sum(0) for m in range(n_mech)], dim=1).double()  # [U, n_mech]
    return counts / fired.sum(0).clamp_min(1)[:, None]


def purity(activations: torch.Tensor, labels: torch.Tensor, n_top: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """Per unit: the largest fraction of its `n_top` strongest activations that share one mechanism, and which one.

    -> (purity [U] in [0, 1], majority mechanism [U], -1 where none of its top activations carries a label).
    """
    frac = mechanism_fractions(activations, labels, n_top)
    best, mech = frac.max(dim=1)
    return best, torch.where(best > 0, mech, torch.full_like(mech, -1))
