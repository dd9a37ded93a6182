"""The modules the DFA procedure swaps in for a model's linear layers, sharing the originals' parameters.

- `DFALinear` replaces a hidden nn.Linear (with the elementwise activation that follows it in an nn.Sequential
  fused in, so that its update has the g'(a_l) of the card's rule) and holds its fixed feedback matrix F_l
  [out_features, n_L] as a buffer: never a parameter, never updated by the optimizer.
- `DFAOutputLinear` replaces the output layer (the head): its backward is where the output error e is taken.

Both read one `FeedbackHub`: the mode ("dfa", or "bp" to compute backprop's gradients for the alignment metrics),
whether the hidden layers train (off during a head-only warm-up), the weight decay λ, and the taps the hidden layers
of the current forward pass have left for the output layer. Outside training (no grad, or eval under no_grad) both
compute the plain function and record nothing.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.recipes.dfa.autograd import ACTIVATIONS, HiddenFunction, OutputFunction, SignalBox

MODES = ("dfa", "bp")


class FeedbackHub:
    """What the DFA layers of one model share (see the module docstring)."""

    def __init__(self, weight_decay: float = 0.0) -> None:
        self.mode = "dfa"
        self.hidden_trains = True
        self.weight_decay = float(weight_decay)
        self.box = SignalBox()
        self.taps: list[torch.Tensor] = []

    def tap(self, tap: torch.Tensor) -> None:
        self.taps.append(tap)

    def close(self) -> tuple[SignalBox, list[torch.Tensor]]:
        """The current pass's box and taps, for its output layer; a new pass starts."""
        box, taps = self.box, self.taps
        self.box, self.taps = SignalBox(), []
        return box, taps

    def reset(self) -> None:
        """Drop taps of a forward pass that never reached the output layer (and the graph they hold)."""
        self.box, self.taps = SignalBox(), []


class DFALinear(nn.Module):
    """h = g(W x + b) with W, b the wrapped nn.Linear's own Parameters; trained by DFA through `feedback`."""

    def __init__(self, linear: nn.Linear, feedback: torch.Tensor, hub: FeedbackHub, activation: str = "identity",
                 site_name: str = "") -> None:
        super().__init__()
        self.weight = linear.weight  # the same Parameter objects: the optimizer and the state dict see no change
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("feedback", feedback.detach().to(linear.weight.dtype).clone())
        self.activation = activation
        self.site_name = site_name
        object.__setattr__(self, "hub", hub)  # shared, not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hub = self.hub
        act = ACTIVATIONS[self.activation]
        if hub.mode == "bp" or not torch.is_grad_enabled() or not self.weight.requires_grad:
            return act(F.linear(x, self.weight, self.bias))
        if not hub.hidden_trains:  # head-only warm-up: this layer is a fixed function, it records nothing
            with torch.no_grad():
                return act(F.linear(x, self.weight, self.bias))
        h, tap = HiddenFunction.apply(x, self.weight, self.bias, self, hub.box)
        hub.tap(tap)
        return h

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"activation={self.activation}, feedback={tuple(self.feedback.shape)}")


class DFAOutputLinear(nn.Module):
    """logits = W_L x + b_L with the wrapped head's Parameters; takes the error e for the hidden layers."""

    def __init__(self, linear: nn.Linear, hub: FeedbackHub, site_name: str = "") -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.site_name = site_name
        object.__setattr__(self, "hub", hub)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hub = self.hub
        if hub.mode == "bp" or not torch.is_grad_enabled():
            hub.reset()
            return F.linear(x, self.weight, self.bias)
        box, taps = hub.close()
        if not self.weight.requires_grad and not taps:
            return F.linear(x, self.weight, self.bias)
        return OutputFunction.apply(x, self.weight, self.bias, self, box, *taps)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None} (DFA output)"
