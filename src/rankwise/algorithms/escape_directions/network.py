"""Bias-free deep ReLU networks in the paper's column convention, and the local loss at the origin saddle.

Z_0^s = X [d_0, N] (columns are samples); Z_l = W_l Z_{l-1}^s with W_l [d_l, d_{l-1}] (torch's [out, in]);
Z_l^s = ReLU(Z_l); the output Y = Z_L has no ReLU. Near theta = 0 the loss is C(0) + L_0(theta) with

    L_0(theta) = Tr[G^T Y_theta],   G = grad C(0)   (MSE C(Y) = ||Y - Y*||_F^2 / (2N) gives G = -Y*/N),

which is positively homogeneous of degree L in theta = (W_1, ..., W_L).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rankwise.errors import InvalidInputError


def check_weights(weights: Sequence[torch.Tensor], x: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Validate a chain of [out, in] weight matrices (and inputs X [d_0, N] when given)."""
    ws = list(weights)
    if len(ws) < 1:
        raise InvalidInputError("a network needs at least one weight matrix")
    for k, w in enumerate(ws):
        if not isinstance(w, torch.Tensor) or w.ndim != 2:
            raise InvalidInputError(f"weight {k} must be a 2-D tensor [out, in]")
        if k and w.shape[1] != ws[k - 1].shape[0]:
            raise InvalidInputError(f"weight {k} takes {w.shape[1]} inputs but layer {k - 1} has {ws[k - 1].shape[0]} "
                                    "outputs")
    if x is not None:
        if x.ndim != 2 or x.shape[0] != ws[0].shape[1]:
            raise InvalidInputError(f"inputs must be [d_0 = {ws[0].shape[1]}, N] (columns are samples), got "
                                    f"{list(x.shape)}")
    return ws


def forward(weights: Sequence[torch.Tensor], x: torch.Tensor, relu: bool = True
            ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(pre-activations [Z_1..Z_L], activations [Z_1^s..Z_{L-1}^s]) of the bias-free ReLU net on X [d_0, N].

    The output is the last pre-activation Z_L (no ReLU on the output layer). `relu=False` is the deep linear net.
    """
    ws = check_weights(weights, x)
    pre, post = [], []
    a = x
    for k, w in enumerate(ws):
        z = w @ a
        pre.append(z)
        if k < len(ws) - 1:
            a = torch.relu(z) if relu else z
            post.append(a)
    return pre, post


def output(weights: Sequence[torch.Tensor], x: torch.Tensor, relu: bool = True) -> torch.Tensor:
    """Y_theta = Z_L [d_L, N]."""
    return forward(weights, x, relu)[0][-1]


def local_loss(weights: Sequence[torch.Tensor], x: torch.Tensor, g: torch.Tensor, relu: bool = True) -> torch.Tensor:
    """L_0(theta) = Tr[G^T Y_theta] = sum(G * Y) for G [d_L, N]."""
    y = output(weights, x, relu)
    if g.shape != y.shape:
        raise InvalidInputError(f"G must be [d_L, N] = {list(y.shape)}, got {list(g.shape)}")
    return (g * y).sum()


def mse_loss(weights: Sequence[torch.Tensor], x: torch.Tensor, y_star: torch.Tensor, relu: bool = True
             ) -> torch.Tensor:
    """C(Y_theta) = ||Y_theta - Y*||_F^2 / (2N). `relu=False`: the deep linear net."""
    y = output(weights, x, relu)
    if y_star.shape != y.shape:
        raise InvalidInputError(f"targets must be [d_L, N] = {list(y.shape)}, got {list(y_star.shape)}")
    return ((y - y_star) ** 2).sum() / (2 * y.shape[1])


def mse_gradient_at_zero(y_star: torch.Tensor) -> torch.Tensor:
    """G = grad C(0) = -Y*/N for the MSE above; Y* is [d_L, N]."""
    if y_star.ndim != 2:
        raise InvalidInputError(f"targets must be [d_L, N], got shape {list(y_star.shape)}")
    return -y_star / y_star.shape[1]


def layer_widths(d_in: int, hidden: int, d_out: int, depth: int) -> list[int]:
    """[d_0, hidden, ..., hidden, d_L] for a depth-L net (L weight matrices)."""
    if depth < 1 or hidden < 1 or d_in < 1 or d_out < 1:
        raise InvalidInputError(f"depth, widths must be positive, got depth {depth}, d_in {d_in}, hidden {hidden}, "
                                f"d_out {d_out}")
    return [d_in, *([hidden] * (depth - 1)), d_out]


def init_weights(widths: Sequence[int], scale: float, generator: torch.Generator | None = None,
                 dtype: torch.dtype = torch.float64, distribution: str = "normal") -> list[torch.Tensor]:
    """Random W_l [widths[l+1], widths[l]] with entries of std `scale / sqrt(fan_in)`.

    `distribution="normal"` draws N(0, scale^2 / fan_in) (small init: scale << 1); "uniform" draws
    U(-scale / sqrt(fan_in), scale / sqrt(fan_in)), which with scale = 1 is PyTorch's default nn.Linear init
    (kaiming_uniform with a = sqrt(5)).
    """
    if scale <= 0:
        raise InvalidInputError(f"scale must be > 0, got {scale}")
    if distribution not in ("normal", "uniform"):
        raise InvalidInputError(f"distribution must be 'normal' or 'uniform', got {distribution!r}")
    ws = []
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        if distribution == "normal":
            w = torch.randn(fan_out, fan_in, generator=generator, dtype=dtype) * (scale / fan_in ** 0.5)
        else:
            w = (torch.rand(fan_out, fan_in, generator=generator, dtype=dtype) * 2 - 1) * (scale / fan_in ** 0.5)
        ws.append(w)
    return ws


def backprop(weights: Sequence[torch.Tensor], x: torch.Tensor, output_grad, relu: bool = True
             ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(Y, dF/dW_l for every layer) by a hand-written backward pass, where dF/dY = output_grad(Y) [d_L, N].

    The same chain rule as autograd (ReLU's derivative taken as 1[z > 0]), without its per-call overhead: the
    projected-gradient and GD loops here run thousands of small steps.
    """
    ws = check_weights(weights, x)
    with torch.no_grad():
        acts, masks = [x], []
        a = x
        for k, w in enumerate(ws):
            z = w @ a
            if k < len(ws) - 1:
                if relu:
                    masks.append(z > 0)
                    a = z.clamp_min(0)
                else:
                    masks.append(None)
                    a = z
                acts.append(a)
        y = z
        delta = output_grad(y)
        grads: list[torch.Tensor] = [torch.empty(0)] * len(ws)
        for k in range(len(ws) - 1, -1, -1):
            grads[k] = delta @ acts[k].T
            if k:
                delta = ws[k].T @ delta
                if masks[k - 1] is not None:
                    delta = delta * masks[k - 1]
    return y, grads


def parameter_norm(weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """||theta|| = sqrt(sum_l ||W_l||_F^2)."""
    return torch.sqrt(sum((w * w).sum() for w in weights))
