"""Online low-rank regression: the factor update at the heart of LoRA-Pre.

An exponential moving average `m <- beta*m + (1-beta)*g` is one gradient step, with step size 1-beta, on the
regression loss 1/2 ||m - g||^2. LoRA-Pre keeps `m` as a product `B @ A` (B [p, r], A [r, q]) and instead takes one
damped Newton step on each factor of 1/2 ||B A - g||^2, using the exact block Hessians A A^T and B^T B:

    B <- (1-gamma) B + gamma * g A^T (A A^T)^-1
    A <- (1-gamma) A + gamma * (B^T B)^-1 B^T g        (with the B just computed: Gauss-Seidel order)

Each factor decays by (1-gamma), so the product decays by about (1-gamma)^2 per step; `gamma_for_beta` picks gamma
so that the product forgets at the rate an EMA with coefficient beta would.
"""

from __future__ import annotations

import torch

# Relative ridge added to an r x r Gram matrix before solving: eps * trace(G)/r * I. It keeps the solve defined when a
# factor is nearly rank deficient (for example B = 0 at the start), while being far below the Gram's own scale.
DEFAULT_RIDGE = 1e-6
# Absolute floor of the ridge, for a Gram matrix that is exactly zero (a factor that never saw a gradient).
_RIDGE_FLOOR = 1e-30


def gamma_for_beta(beta: float, factor_power: int) -> float:
    """Factor step size gamma such that (1-gamma)^factor_power = beta.

    factor_power is 2 for the first moment (the product of two factors decays by (1-gamma)^2) and 4 for the second
    moment (the squared product decays by (1-gamma)^4): gamma1 = 1 - sqrt(beta1), gamma2 = 1 - beta2^(1/4).
    """
    return 1.0 - beta ** (1.0 / factor_power)


def ridge_solve(gram: torch.Tensor, rhs: torch.Tensor, ridge: float = DEFAULT_RIDGE) -> torch.Tensor:
    """Solve (G + lambda I) X = rhs for a symmetric PSD G [r, r] and rhs [r, k]; lambda = ridge * trace(G)/r.

    Solved in float32 at least, whatever the factors' dtype (low-precision Gram solves are unstable).
    """
    r = gram.shape[0]
    work = gram.float() if gram.dtype in (torch.float16, torch.bfloat16) else gram
    lam = max(float(torch.diagonal(work).sum()) * ridge / r, _RIDGE_FLOOR)
    regularized = work + lam * torch.eye(r, dtype=work.dtype, device=work.device)
    return torch.linalg.solve(regularized, rhs.to(work.dtype))


@torch.no_grad()
def newton_factor_step_(b: torch.Tensor, a: torch.Tensor, target: torch.Tensor, gamma: float, ridge: float = DEFAULT_RIDGE) -> None:
    """One damped Newton step of both factors of 1/2 ||b a - target||^2, in place. b [p, r], a [r, q], target [p, q].

    b is updated first from the current a; a is then updated from the new b (Gauss-Seidel order, the reading the
    method card recommends). With gamma = 1 and r = min(p, q) the product becomes `target` exactly (up to the ridge).
    """
    # b <- (1-gamma) b + gamma * target a^T (a a^T)^-1 ; solved as (a a^T)^-1 (a target^T), then transposed.
    b_target = ridge_solve(a @ a.T, a @ target.T, ridge).T
    b.mul_(1.0 - gamma).add_(b_target.to(b.dtype), alpha=gamma)
    # a <- (1-gamma) a + gamma * (b^T b)^-1 b^T target, with the new b.
    a_target = ridge_solve(b.T @ b, b.T @ target, ridge)
    a.mul_(1.0 - gamma).add_(a_target.to(a.dtype), alpha=gamma)


def ridge_regularized(gram: torch.Tensor, ridge: float = DEFAULT_RIDGE) -> torch.Tensor:
    """G_i + lambda_i I for a stack gram [n, r, r], lambda_i = max(ridge * trace(G_i)/r, floor), computed as a tensor
    (no host sync); float32 at least, whatever the Grams' dtype."""
    r = gram.shape[-1]
    work = gram.float() if gram.dtype in (torch.float16, torch.bfloat16) else gram
    lam = (torch.diagonal(work, dim1=-2, dim2=-1).sum(-1) * (ridge / r)).clamp_min_(_RIDGE_FLOOR)  # [n]
    return work + lam[:, None, None] * torch.eye(r, dtype=work.dtype, device=work.device)


def ridge_solve_batched(gram: torch.Tensor, rhs: torch.Tensor, ridge: float = DEFAULT_RIDGE) -> torch.Tensor:
    """`ridge_solve` for a stack: gram [n, r, r] (each symmetric PSD), rhs [n, r, k] -> [n, r, k], each system with
    its own lambda (`ridge_regularized`)."""
    regularized = ridge_regularized(gram, ridge)
    return torch.linalg.solve(regularized, rhs.to(regularized.dtype))


@torch.no_grad()
def newton_factor_steps_(
    b: torch.Tensor, a: torch.Tensor, targets: list[torch.Tensor], gamma: float, ridge: float = DEFAULT_RIDGE,
    target_scale: float = 1.0, absolute: bool = False,
) -> None:
    """`newton_factor_step_` for n same-shape matrices at once, in place: b [n, p, r], a [n, r, q] (stacked factors),
    targets n tensors [p, q]; matrix i is regressed on target_scale * targets[i] (on its absolute value if
    `absolute`).

    The r x r Gram products, solves and factor updates run as batched ops. The two products that touch a [p, q]
    target (a t^T and b^T t) stay one matmul per matrix: batching them would need a stacked copy of the targets, a
    full extra pass over n p q numbers held at once, which costs more than the loop's dispatch (on a CPU, fresh
    pages for every step's copy). For the same reason |t| is formed per matrix and dropped at once (twice, one per
    product), never for all n matrices together. The Newton step is linear in the target, so `target_scale` scales
    the small right-hand sides instead of the [p, q] targets (LoRAPreMuon's g / (1 - mu) without a full pass).
    """
    def prepared(t: torch.Tensor) -> torch.Tensor:
        return t.abs() if absolute else t

    # b <- (1-gamma) b + gamma * t a^T (a a^T)^-1, solved as (a a^T)^-1 (a t^T) and transposed.
    rhs = torch.stack([a_i @ prepared(t).T for a_i, t in zip(a, targets)])  # [n, r, p]
    if target_scale != 1.0:
        rhs.mul_(target_scale)
    b_target = ridge_solve_batched(a @ a.mT, rhs, ridge).mT
    b.mul_(1.0 - gamma).add_(b_target.to(b.dtype), alpha=gamma)
    # a <- (1-gamma) a + gamma * (b^T b)^-1 b^T t, with the new b (Gauss-Seidel order).
    bt = b.mT
    rhs = torch.stack([b_i @ prepared(t) for b_i, t in zip(bt, targets)])  # [n, r, q]
    if target_scale != 1.0:
        rhs.mul_(target_scale)
    a_target = ridge_solve_batched(bt @ b, rhs, ridge)
    a.mul_(1.0 - gamma).add_(a_target.to(a.dtype), alpha=gamma)
