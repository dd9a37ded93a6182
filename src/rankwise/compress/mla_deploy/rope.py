"""Decoupled RoPE for a GQA -> MLA conversion: which rotary dimensions keep their rotation in a small shared key.

A Llama head of width `dh` holds F = dh/2 rotary pairs in the `rotate_half` layout: pair f is dims (f, f + F),
rotated by angle `position * inv_freq[f]`. A latent cache cannot hold RoPE-rotated keys (the rotation does not
commute with the up-projection), so a deployable MLA keeps the rotation on a few pairs only, in one *shared* key of
`rope_dims = 2k` numbers per token, and treats every other key dimension as position-free ("nope"), which then
goes through the low-rank latent.

**Concentration (TransMLA's RoRoPE, our reading).** The g KV heads each have their own copy of pair f. A rotation
that mixes the heads, applied identically to both coordinates of the pair, commutes with the 2-D RoPE rotation, so
`u_f^T k_f` (u_f a unit g-vector) is still a valid rotary pair. We take u_f = the top eigenvector of the pair's
g x g key second moment `M_f = sum_a W_{f,a}^T C W_{f,a}` (a = the pair's two coordinates), i.e. the direction
that carries most of the pair's key energy across heads. The shared rope key holds `u_f^T k_f` for the kept pairs;
each query head h (KV group j) pairs with it through `u_f[j] q_{h,f}`. The rest of the pair, `(I - u_f u_f^T) k_f`,
is removed from the key before the latent factorization and loses its rotation. For MHA-like g = 1 this is exactly
MHA2MLA's partial RoPE.

**Selections of the k kept pairs** (one set shared by all layers, because the exported DeepSeek-V3 checkpoint has
one rotary embedding for the whole model):
  high          the k highest-frequency pairs (MHA2MLA's S_high baseline);
  uniform       every (F/k)-th pair, spanning all wavelengths (MHA2MLA's S_uniform);
  contribution  MHA2MLA's per-frequency 2-norm contribution, measured on calibration data: per layer
                sum_h rms(u_f[j] q_{h,f}) * rms(u_f^T k_f) (RMS from the second moment C instead of MHA2MLA's mean
                norms, since C is what CARE calibrates), normalised to sum 1 per layer, summed over layers, top k.
  sensitivity   ours: the contribution times sqrt(E_d[2 - 2 cos(w_f d)]), d uniform over the context length. Dropping
                the rotation of pair f changes q^T R(w_f d) k into q^T k, an error of size |q||k| |R - I| and
                |R(wd) - I|^2 = 2 - 2 cos(wd): a pair whose frequency barely turns within the context (the large-norm
                low frequencies that `contribution` favours) loses little by becoming position-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rankwise.errors import InvalidInputError, UnknownNameError

SELECTIONS = {
    "high": "the highest-frequency rotary pairs (MHA2MLA S_high)",
    "uniform": "evenly spaced rotary pairs over all wavelengths (MHA2MLA S_uniform)",
    "contribution": "pairs ranked by calibrated query-key 2-norm contribution (MHA2MLA S_2-norm), after RoRoPE concentration",
    "sensitivity": "pairs ranked by the calibrated score error that dropping their rotation causes (ours)",
}


@dataclass(frozen=True)
class PairConcentration:
    """One layer's per-pair head mixing: `direction` [F, g] unit vectors u_f, `key_energy` [F] = E||u_f^T k_f||^2,
    `total_energy` [F] = E||k_f||^2 over all heads (so key_energy / total_energy is the fraction kept)."""

    direction: torch.Tensor
    key_energy: torch.Tensor
    total_energy: torch.Tensor


def _pair_columns(num_heads: int, head_dim: int, pair: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Column indices of pair `pair`'s two coordinates in every head: two LongTensors [num_heads]."""
    base = torch.arange(num_heads) * head_dim + pair
    return base, base + head_dim // 2


def concentrate_pairs(w_k: torch.Tensor, c: torch.Tensor, num_kv_heads: int, head_dim: int) -> PairConcentration:
    """RoRoPE directions for one layer. w_k: math-layout key weight [D, g * dh] (k_proj.weight.T: this file works on
    head columns); c: input second moment [D, D]."""
    if head_dim % 2:
        raise InvalidInputError(f"RoPE needs an even head dimension, got {head_dim}")
    w_k, c = w_k.double(), c.double()
    pairs = head_dim // 2
    directions, key_energy, total = [], [], []
    for f in range(pairs):
        moment = torch.zeros(num_kv_heads, num_kv_heads, dtype=torch.float64)
        for cols in _pair_columns(num_kv_heads, head_dim, f):
            w = w_k[:, cols]  # [D, g]
            moment += w.T @ c @ w
        values, vectors = torch.linalg.eigh((moment + moment.T) / 2)
        u = vectors[:, -1]
        u = u * (1.0 if float(u[int(u.abs().argmax())]) >= 0 else -1.0)  # deterministic sign
        directions.append(u)
        key_energy.append(values[-1].clamp_min(0))
        total.append(moment.trace())
    return PairConcentration(torch.stack(directions), torch.stack(key_energy), torch.stack(total))


def pair_contribution(w_q: torch.Tensor, c: torch.Tensor, conc: PairConcentration, num_heads: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """Per-pair score [F] of one layer: sum_h rms(u_f[j(h)] q_{h,f}) * rms(u_f^T k_f). w_q: [D, n_h * dh]."""
    w_q, c = w_q.double(), c.double()
    pairs = head_dim // 2
    group = torch.arange(num_heads) // (num_heads // num_kv_heads)
    scores = torch.zeros(pairs, dtype=torch.float64)
    for f in range(pairs):
        q_energy = torch.zeros(num_heads, dtype=torch.float64)
        for cols in _pair_columns(num_heads, head_dim, f):
            w = w_q[:, cols]  # [D, n_h]
            q_energy += ((c @ w) * w).sum(0)  # diag(W^T C W): E q^2 per head
        weight = conc.direction[f, group] ** 2
        scores[f] = ((weight * q_energy).clamp_min(0).sqrt()).sum() * conc.key_energy[f].sqrt()
    return scores


def rotation_sensitivity(inv_freq: torch.Tensor, context: int) -> torch.Tensor:
    """sqrt(mean over d in [0, context) of 2 - 2 cos(w_f d)) per pair: [F] float64, ~sqrt(2) for fast pairs, ~0 for slow."""
    d = torch.arange(context, dtype=torch.float64)
    return (2 - 2 * torch.cos(inv_freq.double()[:, None] * d[None, :])).mean(1).sqrt()


def select_pairs(selection: str, keep: int, pairs: int, layer_scores: Sequence[torch.Tensor] | None = None) -> list[int]:
    """Sorted indices of the `keep` rotary pairs (out of `pairs`) that stay rotary, by `selection`."""
    if selection not in SELECTIONS:
        raise UnknownNameError(f"unknown rope selection {selection!r}; choose one of {sorted(SELECTIONS)}")
    if not 1 <= keep <= pairs:
        raise InvalidInputError(f"rope_dims must be an even number in [2, {2 * pairs}] (the head dim), got {2 * keep}")
    if selection == "high":
        return list(range(keep))
    if selection == "uniform":
        stride = pairs / keep
        return sorted({int(i * stride) for i in range(keep)})
    if not layer_scores:
        raise InvalidInputError(f"the {selection!r} rope selection needs calibration scores")
    total = torch.zeros(pairs, dtype=torch.float64)
    for s in layer_scores:
        total += s / s.sum().clamp_min(1e-300)  # each layer votes equally, whatever its activation scale
    order = sorted(range(pairs), key=lambda f: (-float(total[f]), f))  # ties: the higher frequency first
    return sorted(order[:keep])


def rope_columns(pairs_kept: Sequence[int], head_dim: int) -> torch.Tensor:
    """Head-dim indices of the kept pairs in a `rotate_half` layout of width 2k: [f_1..f_k, f_1+F..f_k+F]. -> [2k]"""
    kept = torch.tensor(list(pairs_kept), dtype=torch.long)
    return torch.cat([kept, kept + head_dim // 2])


@dataclass(frozen=True)
class DecoupledRope:
    """Math-layout weights (x @ W, i.e. the transposes of torch weights) of one layer's decoupled RoPE and the
    position-free remainder of the key; `build.py` transposes them into the torch-layout MLA weights.

    q_rope [D, n_h * 2k] (per head, rotate_half layout over the kept pairs), k_rope [D, 2k] (the shared key),
    k_nope [D, g * dh] (W_K with the concentrated component of every kept pair projected out).
    """

    q_rope: torch.Tensor
    k_rope: torch.Tensor
    k_nope: torch.Tensor


def decouple_rope(w_q: torch.Tensor, w_k: torch.Tensor, conc: PairConcentration, pairs_kept: Sequence[int], num_heads: int, num_kv_heads: int, head_dim: int) -> DecoupledRope:
    """Split one layer's RoPE into the shared rope key (kept pairs, concentrated) and the no-RoPE key remainder.

    For each kept pair f and coordinate a: k_rope = W_{f,a} u_f, q_rope(head h) = u_f[j(h)] W^Q_{h,f,a}, and
    W_{f,a} <- W_{f,a} (I - u_f u_f^T) in the nope key. Then, before any rotation, q_h . k_j over all head dims
    equals q_rope_h . k_rope + q_h . k_nope_j exactly; only the rotation of the non-kept parts is lost.
    """
    w_q, w_k = w_q.double(), w_k.double()
    k = len(pairs_kept)
    group = torch.arange(num_heads) // (num_heads // num_kv_heads)
    k_rope = torch.zeros(w_k.size(0), 2 * k, dtype=torch.float64)
    q_rope = torch.zeros(w_q.size(0), num_heads, 2 * k, dtype=torch.float64)
    k_nope = w_k.clone()
    for i, f in enumerate(pairs_kept):
        u = conc.direction[f].double()
        for a, (k_cols, q_cols) in enumerate(zip(_pair_columns(num_kv_heads, head_dim, f), _pair_columns(num_heads, head_dim, f))):
            slot = i + a * k  # rotate_half layout of the rope key: all first coordinates, then all second ones
            w = w_k[:, k_cols]  # [D, g]
            k_rope[:, slot] = w @ u
            k_nope[:, k_cols] = w - torch.outer(w @ u, u)
            q_rope[:, :, slot] = w_q[:, q_cols] * u[group]
    return DecoupledRope(q_rope.reshape(w_q.size(0), num_heads * 2 * k), k_rope, k_nope)
