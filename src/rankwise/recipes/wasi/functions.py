"""The custom autograd functions of a WASI linear layer: each saves only what its form of the method keeps.

The activation is stored either `exact` (the input x itself, as plain backprop does) or as its Tucker factors
(`tucker`: core S and U_0, U_1, U_2, from `tucker.ActivationSubspace`); the input is never saved in the second case,
and the backward reads the factors only (`tucker.gradient_against`).

Three weight forms (x [..., I], output [..., O]):

- `FactoredLinear` (the low-memory variant): the trained tensors are L [O, K] and R [K, I] themselves; no dense W
  exists. Saved: L, R and the stored activation. Its gradients are the weight gradient G = dL/dW projected onto the
  tangent space of the rank-K matrices at W = L R (the paper's "linear operator in the low-rank space"),
      T(G) = P_L G + (I - P_L) G P_R,   P_L = L L^T (L orthonormal),  P_R = R^+ R,
  split between the factors as  grad_L = G R^+  and  grad_R = L^T G - (L^T grad_L) R  (R^+ = R^T (R R^T)^-1, from
  a float64 K x K pseudo-inverse), so that grad_L R + L grad_R = T(G). Why this split: an SGD step on (L, R) with
  these gradients, followed by the WSI step (`subspace.factored_step`), equals to first order in the step size the
  paper's update -- an SGD step on a dense W = L R followed by its subspace-iteration step -- whose first-order term
  is exactly T(G). G itself is never formed when the activation is Tucker: only L^T G [K, I] and G R^T [O, K].
- `MasterLinear` (the paper's variant, as evaluated): a dense master W is the Parameter that receives G; the forward
  runs the low-rank L, R (buffers, refreshed from W by one subspace-iteration step per optimizer step). Saved: L,
  R and the activation (W is an input only to carry its gradient, as in the authors' "pseudo implementation").
- `DenseLinear` (ASI only): the plain weight W, x W^T + b, with the compressed activation. Saved: W and the activation.

The input gradient of the low-rank forms is (dY L) R; the bias gradient is dY summed over every leading axis.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd import Function
from torch.nn import functional as F

from rankwise.recipes.wasi.tucker import gradient_against

EXACT, TUCKER = "exact", "tucker"


def _flat(t: torch.Tensor) -> torch.Tensor:
    """[..., X] -> [rows, X]."""
    return t.reshape(-1, t.shape[-1])


def _as_3d(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(1) if t.dim() == 2 else t


def weight_gradient(dy: torch.Tensor, stored: tuple[torch.Tensor, ...], kind: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(M, U) with the weight gradient G = dY^T A equal to M @ U^T (U the Tucker feature factor [I, r2]), or (G, None)
    for an exact activation. dy [..., O] matches the layer's output."""
    if kind == EXACT:
        (x,) = stored
        return _flat(dy).t() @ _flat(x), None
    core, u0, u1, u2 = stored
    return gradient_against(_as_3d(dy), core, (u0, u1, u2)), u2


def _bias_gradient(dy: torch.Tensor) -> torch.Tensor:
    return dy.sum(dim=tuple(range(dy.dim() - 1)))


def solve_gram(r: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """rhs (R R^T)^-1 for rhs [O, K]: the K x K inverse in float64 (from a Cholesky factor, or the pseudo-inverse
    when R R^T is singular: a rank-deficient R does not break the backward), the product in rhs's dtype."""
    r64 = r.detach().double()
    gram = r64 @ r64.t()
    chol, info = torch.linalg.cholesky_ex(gram)
    inverse = torch.cholesky_inverse(chol) if int(info) == 0 else torch.linalg.pinv(gram, hermitian=True)
    return rhs @ inverse.to(rhs.dtype)


def tangent_gradients(l: torch.Tensor, r: torch.Tensor, g_rt: torch.Tensor, lt_g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_L [O, K], grad_R [K, I]) from G R^T [O, K] and L^T G [K, I] (see the module docstring)."""
    grad_l = solve_gram(r, g_rt)
    grad_r = lt_g - (l.t() @ grad_l) @ r
    return grad_l, grad_r


class FactoredLinear(Function):
    """y = (x R^T) L^T + b with trainable L, R; apply(x, L, R, bias, kind, *stored)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, l: torch.Tensor, r: torch.Tensor, bias: torch.Tensor | None, kind: str,
                *stored: torch.Tensor) -> torch.Tensor:
        ctx.kind, ctx.has_bias = kind, bias is not None
        ctx.save_for_backward(l, r, *stored)
        return F.linear(F.linear(x, r), l, bias)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):
        l, r, *stored = ctx.saved_tensors
        need_x, need_l, need_r, need_b = ctx.needs_input_grad[:4]
        dy_l = dy @ l  # [..., K]: the output gradient in the rank-K space
        dx = dy_l @ r if need_x else None
        dl = dr = None
        if need_l or need_r:
            if ctx.kind == EXACT:
                (x,) = stored
                g_rt = _flat(dy).t() @ (_flat(x) @ r.t())  # G R^T [O, K]
                lt_g = _flat(dy_l).t() @ _flat(x)  # L^T G [K, I]
            else:
                m, u = weight_gradient(dy, tuple(stored), ctx.kind)  # G = M U^T
                g_rt = m @ (r @ u).t()
                lt_g = (l.t() @ m) @ u.t()
            dl, dr = tangent_gradients(l, r, g_rt, lt_g)
        db = _bias_gradient(dy) if need_b and ctx.has_bias else None
        return dx, dl if need_l else None, dr if need_r else None, db, None, *([None] * len(stored))


class MasterLinear(Function):
    """y = (x R^T) L^T + b, the gradient of the loss w.r.t. the low-rank product routed to the dense master W;
    apply(x, W, L, R, bias, kind, *stored)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, l: torch.Tensor, r: torch.Tensor,
                bias: torch.Tensor | None, kind: str, *stored: torch.Tensor) -> torch.Tensor:
        ctx.kind, ctx.has_bias = kind, bias is not None
        ctx.save_for_backward(l, r, *stored)
        return F.linear(F.linear(x, r), l, bias)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):
        l, r, *stored = ctx.saved_tensors
        need_x, need_w, _, _, need_b = ctx.needs_input_grad[:5]
        dx = (dy @ l) @ r if need_x else None
        dw = None
        if need_w:
            m, u = weight_gradient(dy, tuple(stored), ctx.kind)
            dw = m if u is None else m @ u.t()
        db = _bias_gradient(dy) if need_b and ctx.has_bias else None
        return dx, dw, None, None, db, None, *([None] * len(stored))


class DenseLinear(Function):
    """y = x W^T + b with the activation stored compressed (ASI alone); apply(x, W, bias, kind, *stored)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, kind: str,
                *stored: torch.Tensor) -> torch.Tensor:
        ctx.kind, ctx.has_bias = kind, bias is not None
        ctx.save_for_backward(weight, *stored)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):
        weight, *stored = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dy @ weight if need_x else None
        dw = None
        if need_w:
            m, u = weight_gradient(dy, tuple(stored), ctx.kind)
            dw = m if u is None else m @ u.t()
        db = _bias_gradient(dy) if need_b and ctx.has_bias else None
        return dx, dw, db, None, *([None] * len(stored))
