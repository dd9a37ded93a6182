"""Top-r singular triplets of a layer weight, the initialisation step of PiCa and PiSSA (and GuardSpace's relatives).

A full SVD of every targeted layer is the slow part of building such adapters (seconds per layer on a busy
2-core CPU). We need only the top r triplets, so we eigendecompose the smaller Gram matrix in float64 on one
thread (`core.threads.limit_threads`): W^T W [in, in] when in <= out, else W W^T [out, out] and recover the
other side as W^T U / sigma. In float64 this keeps the top singular vectors accurate to ~1e-12 relative to
sigma_1^2 / gap; where a requested singular value is too small for the division to be safe we fall back to a full
SVD.
"""

from __future__ import annotations

import torch

from rankwise.core.threads import limit_threads

_SAFE_RATIO = 1e-6  # sigma_r / sigma_1 below this: use a full SVD (the Gram route would lose the small vectors)


def top_singular(weight: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """U_r [out, r], S_r [r] (descending), Vh_r [r, in] of W [out, in], all float64 (singular vectors' signs arbitrary)."""
    w = weight.detach().double()
    out_f, in_f = w.shape
    with limit_threads(1, at_most=True):
        gram = w.T @ w if in_f <= out_f else w @ w.T
        evals, evecs = torch.linalg.eigh(gram)  # ascending
        evals, evecs = evals.flip(0)[:r].clamp_min(0), evecs.flip(1)[:, :r]
        s = evals.sqrt()
        if s[-1] <= _SAFE_RATIO * s[0]:
            u, s_full, vh = torch.linalg.svd(w, full_matrices=False)
            return u[:, :r], s_full[:r], vh[:r]
        if in_f <= out_f:
            vh = evecs.T
            u = (w @ evecs) / s
        else:
            u = evecs
            vh = ((w.T @ evecs) / s).T
    return u, s, vh
