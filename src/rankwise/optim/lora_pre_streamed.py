"""LoRA-Pre's fast step: one cache-sized pass over each gradient does the factor regression and the AdamW update.

The reference step (`LoRAPre._factored_step`) reads each [p, q] gradient g about ten times: four thin matmuls for
the two Newton regressions (g A^T, B^T g and the same for |g|), |g| itself, the two reconstructions and the
elementwise update. On a CPU those are separate passes over matrices larger than the L2 cache. All of them are
separable by rows, so this step walks the matrix in blocks of rows that fit in L2 and does everything for a block
while it is there:

    B_new[rows] = (1-gamma) B[rows] + gamma (g[rows] A^T) (A A^T + lambda I)^-1     (A A^T is known before the pass)
    rhs_A      += B_new[rows]^T g[rows]                                          (accumulated over the blocks)
    m[rows]     = beta1 m_B[rows] m_A + (1-beta1) g[rows]                          (previous moments: old factors)
    sqrt(v)     = sqrt(1-beta2) sqrt((c v_B[rows] v_A)^2 + g[rows]^2),  c = sqrt(beta2/(1-beta2))
    W[rows]    <- W[rows] - lr/bc1 m / (sqrt(v)/bc2 + eps)

and after the pass A_new = (1-gamma) A + gamma (B_new^T B_new + lambda I)^-1 rhs_A: the Gauss-Seidel order of
`newton_factor_step_` (A's step uses the new B), because B_new's rows are final as soon as their block is done.
The r x r Grams, inverses and solves of all same-shape matrices run batched. With `use_updated_factors` the
reconstruction needs the new A, so a second pass does the update.

Equal to `LoRAPre._factored_step` up to float rounding (an r x r inverse instead of a solve, and regrouped
arithmetic): tests/optim/test_lora_pre_batched.py compares them in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rankwise.optim.low_rank_regression import ridge_regularized

# Rows per block are chosen so that a block holds about this many entries: 128k float32 numbers (512 KiB) per
# [rows, q] temporary. The block's gradient, its |g| and the two reconstructions then stay in a 2 MiB L2 cache;
# much smaller blocks make the thin matmuls inefficient and multiply the per-op dispatch cost.
BLOCK_NUMEL = 2**17


@dataclass(frozen=True)
class AdamFactorStep:
    """The scalars of one LoRA-Pre step shared by a bucket of matrices (same step count and group)."""

    beta1: float
    beta2: float
    gamma1: float  # factor step of the first moment's regression on g
    gamma2: float  # factor step of the second moment's regression on |g|
    lr: float
    eps: float
    weight_decay: float
    ridge: float
    bias_correction1: float
    bias_correction2_sqrt: float
    use_updated_factors: bool


def regularized_inverse(gram: torch.Tensor, ridge: float) -> torch.Tensor:
    """(G_i + lambda_i I)^-1 for a stack gram [n, r, r] of symmetric PSD matrices, lambda_i = max(ridge trace/r,
    floor) as in `ridge_regularized`. Inverted in float32 at least.

    By Cholesky: the ridge makes each system positive definite, and on a CPU a batched Cholesky inverse is ~30x
    faster than a batched LU solve with q right-hand sides (MKL's batched getrs). A system that rounding left
    indefinite falls back to LU."""
    regularized = ridge_regularized(gram, ridge)
    factor, info = torch.linalg.cholesky_ex(regularized)
    if bool(info.any()):
        return torch.linalg.inv(regularized)
    return torch.cholesky_inverse(factor)


@torch.no_grad()
def streamed_adam_factor_steps_(
    params: list[torch.Tensor], factors: list[list[torch.Tensor]], hp: AdamFactorStep, block_numel: int = BLOCK_NUMEL,
) -> list[torch.Tensor]:
    """One LoRA-Pre step for n same-shape matrices: updates every params[i] [p, q] in place from its .grad and
    returns the new factors stacked, [m_B [n, p, r], m_A [n, r, q], v_B [n, p, r], v_A [n, r, q]].

    factors: the current factors per key (m_B, m_A, v_B, v_A), each a list of n tensors (left untouched; the
    caller stores the returned ones). Factors are float32 or float64; low-precision weights are updated from a
    float32 update rounded once, as in the reference step.
    """
    m_b, m_a, v_b, v_a = (torch.stack(f) for f in factors)
    rows_per_block = max(1, block_numel // params[0].shape[1])
    inv_m = regularized_inverse(m_a @ m_a.mT, hp.ridge).to(m_a.dtype)  # [n, r, r]
    inv_v = regularized_inverse(v_a @ v_a.mT, hp.ridge).to(v_a.dtype)
    new_m_b, new_v_b = torch.empty_like(m_b), torch.empty_like(v_b)
    rhs_m_a, rhs_v_a = torch.zeros_like(m_a), torch.zeros_like(v_a)
    scale, step_size = _update_scalars(hp)
    reconstruct_now = not hp.use_updated_factors
    v_b_scaled = v_b * math.sqrt(hp.beta2 / (1.0 - hp.beta2)) if reconstruct_now else None

    for i, p in enumerate(params):
        for rows in _row_blocks(p.shape[0], rows_per_block):
            g = _block_gradient(p, rows, m_b.dtype)
            g_abs = g.abs()
            torch.addmm(m_b[i, rows], g @ m_a[i].T, inv_m[i], beta=1 - hp.gamma1, alpha=hp.gamma1, out=new_m_b[i, rows])
            rhs_m_a[i].addmm_(new_m_b[i, rows].T, g)
            torch.addmm(v_b[i, rows], g_abs @ v_a[i].T, inv_v[i], beta=1 - hp.gamma2, alpha=hp.gamma2, out=new_v_b[i, rows])
            rhs_v_a[i].addmm_(new_v_b[i, rows].T, g_abs)
            if reconstruct_now:
                _update_block(p, rows, g, (m_b[i, rows], m_a[i], v_b_scaled[i, rows], v_a[i]), hp, scale, step_size, g_abs)

    new_m_a = _factor_a_step(m_a, new_m_b, rhs_m_a, hp.gamma1, hp.ridge)
    new_v_a = _factor_a_step(v_a, new_v_b, rhs_v_a, hp.gamma2, hp.ridge)
    if not reconstruct_now:  # the previous moments from the factors after this step's regression: a second pass
        new_v_b_scaled = new_v_b * math.sqrt(hp.beta2 / (1.0 - hp.beta2))
        for i, p in enumerate(params):
            for rows in _row_blocks(p.shape[0], rows_per_block):
                g = _block_gradient(p, rows, m_b.dtype)
                _update_block(p, rows, g, (new_m_b[i, rows], new_m_a[i], new_v_b_scaled[i, rows], new_v_a[i]), hp, scale, step_size)
    return [new_m_b, new_m_a, new_v_b, new_v_a]


def _update_scalars(hp: AdamFactorStep) -> tuple[float, float]:
    """sqrt(v)/bc2 + eps = scale (hypot + eps/scale), so the update is step_size * m / (hypot + eps/scale)."""
    scale = math.sqrt(1.0 - hp.beta2) / hp.bias_correction2_sqrt
    return scale, -(hp.lr / hp.bias_correction1) / scale


def _row_blocks(n_rows: int, rows_per_block: int) -> list[slice]:
    return [slice(start, min(start + rows_per_block, n_rows)) for start in range(0, n_rows, rows_per_block)]


def _block_gradient(p: torch.Tensor, rows: slice, dtype: torch.dtype) -> torch.Tensor:
    g = p.grad[rows]
    return g.to(dtype) if g.dtype != dtype else g


def _update_block(
    p: torch.Tensor, rows: slice, g: torch.Tensor, moments: tuple[torch.Tensor, ...], hp: AdamFactorStep,
    scale: float, step_size: float, scratch: torch.Tensor | None = None,
) -> None:
    """W[rows] <- (1 - lr wd) W[rows] + step_size m / (sqrt((c v_B v_A)^2 + g^2) + eps/scale) for one block.

    moments: (m_B[rows] [k, r], m_A [r, q], c v_B[rows] [k, r], v_A [r, q]); `scratch` [k, q], if given, is
    overwritten (the block's |g|, no longer needed) instead of allocating the denominator."""
    m_b, m_a, v_b_scaled, v_a = moments
    exp_avg = torch.addmm(g, m_b, m_a, beta=1 - hp.beta1, alpha=hp.beta1)
    denom = torch.mm(v_b_scaled, v_a, out=scratch) if scratch is not None else v_b_scaled @ v_a
    # hypot(denom, g) as sqrt(denom^2 + g^2): a quarter faster on a CPU, and it squares g as AdamW itself does
    denom.square_().addcmul_(g, g).sqrt_().add_(hp.eps / scale)
    weights = p[rows]
    if hp.weight_decay != 0:
        weights.mul_(1 - hp.lr * hp.weight_decay)
    if weights.dtype != exp_avg.dtype:  # formed in float32 and rounded once to the weights' dtype
        weights.add_(exp_avg.div_(denom).to(weights.dtype), alpha=step_size)
    else:
        weights.addcdiv_(exp_avg, denom, value=step_size)


def _factor_a_step(a: torch.Tensor, new_b: torch.Tensor, rhs: torch.Tensor, gamma: float, ridge: float) -> torch.Tensor:
    """A <- (1-gamma) A + gamma (B^T B + lambda I)^-1 rhs, with the new B [n, p, r] and rhs = B^T g [n, r, q]."""
    inverse = regularized_inverse(new_b.mT @ new_b, ridge)
    solved = inverse @ rhs.to(inverse.dtype)
    return a.mul(1.0 - gamma).add_(solved.to(a.dtype), alpha=gamma)
