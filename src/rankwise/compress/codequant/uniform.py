"""The uniform-grid weight baselines at equal bits: round-to-nearest (RTN) and GPTQ.

Grid: asymmetric b-bit per row (or per group of inputs), 2^b levels, scale = clip * (max - min) / (2^b - 1),
zero-point rounded to an integer code, with `clip` chosen per row by weight MSE from a grid. This is a stronger RTN
than the card's per-row symmetric one (it uses all 2^b codes, as the 16 centroids do, and is tuned), so the
comparison with clustering is at equal bits and against a tuned grid.

GPTQ (Frantar et al.) quantizes the columns one at a time and spreads each column's rounding error over the columns
not yet quantized, using the inverse Hessian H = 2 XᵀX / N of the layer's calibration inputs (dampened by a
fraction of its mean diagonal), in blocks of 128 columns (the lazy batch update). Scales come from the row (group)
before its first column is quantized, as in the reference implementation.
"""

from __future__ import annotations

import torch

from rankwise.errors import InvalidInputError, NumericalError

CLIPS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7)


def _levels(bits: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise InvalidInputError(f"weight bits must be an integer in [2, 8], got {bits!r}")
    return 2**bits - 1


def grid_of(w: torch.Tensor, bits: int, clips: tuple[float, ...] = CLIPS) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (scale [R, 1], zero [R, 1]) of `w [R, n]` minimising the row's squared rounding error over `clips`."""
    qmax = _levels(bits)
    lo, hi = w.amin(1, keepdim=True).clamp_max(0), w.amax(1, keepdim=True).clamp_min(0)
    best_err = torch.full((w.shape[0], 1), float("inf"), dtype=w.dtype)
    best_scale, best_zero = torch.ones_like(best_err), torch.zeros_like(best_err)
    for c in clips:
        scale = ((hi - lo) * c / qmax).clamp_min(torch.finfo(w.dtype).tiny)
        zero = torch.round(-lo * c / scale)
        err = ((round_to_grid(w, scale, zero, bits) - w) ** 2).sum(1, keepdim=True)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_scale, best_zero = torch.where(better, scale, best_scale), torch.where(better, zero, best_zero)
    return best_scale, best_zero


def round_to_grid(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """Dequantized nearest grid point: scale * (clamp(round(w / scale) + zero, 0, 2^b - 1) - zero)."""
    q = torch.clamp(torch.round(w / scale) + zero, 0, _levels(bits))
    return scale * (q - zero)


def _grouped(weight: torch.Tensor, group: int | None) -> tuple[torch.Tensor, int]:
    out, inp = weight.shape
    g = inp if group is None else group
    if isinstance(g, bool) or not isinstance(g, int) or g < 1 or inp % g:
        raise InvalidInputError(f"weight group {group!r} must be a positive divisor of the input size {inp}")
    return weight.reshape(out * (inp // g), g), g


def rtn(weight: torch.Tensor, bits: int = 4, group: int | None = None) -> torch.Tensor:
    """Round-to-nearest of `weight [out, in]` per row (or group), clip tuned by MSE; dequantized, same shape."""
    rows, _ = _grouped(weight.detach().float(), group)
    scale, zero = grid_of(rows, bits)
    return round_to_grid(rows, scale, zero, bits).reshape(weight.shape)


def hessian(inputs: torch.Tensor) -> torch.Tensor:
    """H = 2 XᵀX / N in float64 from a layer's inputs [N, in]."""
    x = inputs.detach().double().reshape(-1, inputs.shape[-1])
    return 2.0 * x.T @ x / x.shape[0]


@torch.no_grad()
def gptq(weight: torch.Tensor, h: torch.Tensor, bits: int = 4, group: int | None = None, damp: float = 0.01,
         block: int = 128) -> torch.Tensor:
    """GPTQ of `weight [out, in]` with Hessian `h [in, in]`; returns the dequantized weight, fp32 [out, in]."""
    out, inp = weight.shape
    if h.shape != (inp, inp):
        raise InvalidInputError(f"the Hessian must be [{inp}, {inp}], got {tuple(h.shape)}")
    gs = inp if group is None else group
    _grouped(weight, group)
    if not damp > 0:
        raise InvalidInputError(f"damp must be positive, got {damp!r}")
    w = weight.detach().double().clone()
    h = h.double().clone()
    dead = torch.diagonal(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += damp * torch.diagonal(h).mean() * torch.eye(inp, dtype=h.dtype)
    try:
        hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    except RuntimeError as e:  # not positive definite even after damping
        raise NumericalError(f"GPTQ's Hessian is not positive definite with damp {damp}: raise it") from e
    q = torch.zeros_like(w)
    scale = zero = None
    for b0 in range(0, inp, block):
        b1 = min(b0 + block, inp)
        err = torch.zeros(out, b1 - b0, dtype=w.dtype)
        for i in range(b0, b1):
            if i % gs == 0:
                scale, zero = grid_of(w[:, i:i + gs], bits)
            col = w[:, i:i + 1]
            qc = round_to_grid(col, scale, zero, bits)
            q[:, i:i + 1] = qc
            e = (col - qc) / hinv[i, i]
            w[:, i + 1:b1] -= e @ hinv[i:i + 1, i + 1:b1]
            err[:, i - b0:i - b0 + 1] = e
        w[:, b1:] -= err @ hinv[b0:b1, b1:]
    if not torch.isfinite(q).all():
        raise NumericalError("GPTQ produced non-finite weights")
    return q.float()
