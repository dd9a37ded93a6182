"""The DFA step as autograd: `loss.backward()` runs direct feedback alignment, not backpropagation.

Two custom functions share, per forward pass, a `SignalBox`:

- `HiddenFunction` (a hidden layer, h = g(W x + b)): its forward returns h *non-differentiable* — nothing downstream
  of it records a graph or saves a tensor for it — plus a 0-dim "tap" that carries the graph edge to the output
  layer. It saves only x (its own input, for ΔW = δ xᵀ) and what g' needs (h for relu/tanh/sigmoid, a for gelu/silu,
  nothing for identity). Its backward reads the output error e from the box and returns
      δ = (e F_lᵀ) ⊙ g'(a),   ∂W = δᵀ x (+ λ W),   ∂b = Σ δ,   and no gradient for x:
  the error never travels back through the network, so no layer above is needed (nor held) to update this one.
- `OutputFunction` (the output layer, logits = W_L h + b_L): its inputs are the hidden layers' taps too, so autograd
  runs it before any of them. Its backward receives e = ∂L/∂logits (softmax − onehot over the batch size for mean
  cross-entropy: BP's own error at the logits), writes it into the box, returns the output layer's gradient
  e hᵀ (+ λ W_L), identical to BP's, and a zero for each tap (the edge that wakes the hidden layer's backward up).

What backprop holds and DFA does not: every tensor saved by the operations between the layers (attention scores,
norms, activations functions applied outside a fused layer, residual sums) — those run on non-differentiable tensors
and record nothing. The weights are never saved either (the update needs no W_{l+1}), so a weight changed between
the forward and the backward changes no other layer's update.

Errors over more positions than the output has (tokens [B, T, n] under a sequence output [B, n_L]) are broadcast:
every position of example b receives F_l e_b divided by the number of positions (BP's share through a mean pool).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from rankwise.errors import InvalidInputError, NumericalError

# Elementwise activations a hidden layer can fuse: name -> function. g' comes from the output for the first three
# (so the saved output is also the next layer's saved input: no extra memory), from the pre-activation otherwise.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda a: a,
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "gelu": F.gelu,
    "gelu_tanh": lambda a: F.gelu(a, approximate="tanh"),
    "silu": F.silu,
}
FROM_OUTPUT = ("relu", "tanh", "sigmoid")


def activation_derivative(name: str, signal: torch.Tensor, saved: torch.Tensor | None) -> torch.Tensor:
    """signal ⊙ g'(a) for activation `name`; `saved` is h (FROM_OUTPUT), a (the others) or None (identity)."""
    if name == "identity":
        return signal
    if name == "relu":
        return signal * (saved > 0)
    if name == "tanh":
        return signal * (1 - saved * saved)
    if name == "sigmoid":
        return signal * (saved * (1 - saved))
    with torch.enable_grad():  # the exact derivative of any other elementwise g, from a
        a = saved.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(ACTIVATIONS[name](a), a, signal)
    return grad


class SignalBox:
    """The output error e of one forward pass [*lead, n_L]: written by the output layer's backward, read by every
    hidden layer's backward of that pass."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: torch.Tensor | None = None


def broadcast_signal(signal: torch.Tensor, lead: torch.Size) -> tuple[torch.Tensor, int]:
    """signal [*lead_e, n] viewed against a layer output with leading dims `lead`: (signal [*lead_e, 1.., n],
    positions per example). `lead_e` must equal `lead` or be a prefix of it."""
    lead_e = signal.shape[:-1]
    if tuple(lead_e) == tuple(lead):
        return signal, 1
    if len(lead_e) < len(lead) and tuple(lead[: len(lead_e)]) == tuple(lead_e):
        extra = tuple(lead[len(lead_e):])
        positions = 1
        for d in extra:
            positions *= d
        return signal.reshape(*lead_e, *([1] * len(extra)), signal.shape[-1]), positions
    raise InvalidInputError(f"DFA cannot route an output error over leading dims {tuple(lead_e)} to a layer output over "
                            f"{tuple(lead)}: the output's leading dims must equal or prefix the layer's")


class HiddenFunction(torch.autograd.Function):
    """(x [*, n_in], W [n, n_in], b [n] or None, layer) -> (h = g(W x + b) [*, n] non-differentiable, tap [])."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, layer: Any,
                box: SignalBox) -> tuple[torch.Tensor, torch.Tensor]:
        a = F.linear(x, weight, bias)
        name = layer.activation
        h = ACTIVATIONS[name](a)
        stash = h if name in FROM_OUTPUT else None if name == "identity" else a
        ctx.save_for_backward(x, stash)
        ctx.layer, ctx.box, ctx.has_bias = layer, box, bias is not None
        ctx.mark_non_differentiable(h)
        ctx.set_materialize_grads(False)
        return h, x.new_zeros(())

    @staticmethod
    def backward(ctx: Any, grad_h: torch.Tensor | None, grad_tap: torch.Tensor | None):
        x, stash = ctx.saved_tensors
        error, layer = ctx.box.error, ctx.layer
        if error is None:
            raise NumericalError(f"DFA layer {layer.site_name!r}: no output error reached it (the loss must come from the "
                                 "DFA output layer of the same forward pass)")
        feedback = layer.feedback
        signal = error.to(feedback.dtype) @ feedback.T  # [*lead_e, n]
        lead = x.shape[:-1]
        signal, positions = broadcast_signal(signal, lead)
        if positions > 1:
            signal = signal / positions
        signal = signal.expand(*lead, feedback.shape[0])
        delta = activation_derivative(layer.activation, signal, stash).reshape(-1, feedback.shape[0])
        grad_w = delta.T.to(x.dtype) @ x.reshape(-1, x.shape[-1])
        decay = layer.hub.weight_decay
        if decay:
            grad_w = grad_w + decay * layer.weight.detach()  # the card's λ_t W_l term, part of the DFA update
        grad_b = delta.sum(0).to(x.dtype) if ctx.has_bias else None
        return None, grad_w, grad_b, None, None


class OutputFunction(torch.autograd.Function):
    """(x [*, n_in], W_L [n_L, n_in], b_L, layer, box, *taps) -> logits [*, n_L]; its backward stores e in the box."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, layer: Any,
                box: SignalBox, *taps: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.layer, ctx.box, ctx.has_bias, ctx.num_taps = layer, box, bias is not None, len(taps)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        (x,) = ctx.saved_tensors
        ctx.box.error = grad_out.detach()
        layer = ctx.layer
        g = grad_out.reshape(-1, grad_out.shape[-1])
        grad_w = g.T @ x.reshape(-1, x.shape[-1])
        decay = layer.hub.weight_decay
        if decay:
            grad_w = grad_w + decay * layer.weight.detach()
        grad_b = g.sum(0) if ctx.has_bias else None
        # An input that records a graph (nothing the procedure trains does: it freezes everything else) gets BP's
        # gradient, so that the output layer stays exact whatever feeds it.
        grad_x = grad_out @ layer.weight.detach() if ctx.needs_input_grad[0] else None
        zero = grad_out.new_zeros(())
        return (grad_x, grad_w, grad_b, None, None, *([zero] * ctx.num_taps))
