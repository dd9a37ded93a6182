"""TraDy's memory accounting: the per-channel space cost Θ_space,c = C^W_c + C^A_c of a conv or linear layer, the
layer geometry it is read from, and the budget fill of Algorithm 1.

For a conv layer with weight W [C', C, D, D] and input A [B, C, H, W], updating input channel c needs the slice
A[:, c] (H·W values per example: C^A_c) and produces dW[:, c] (C'·D·D values: C^W_c). A linear layer is the case
D = 1 with H·W the number of rows per example (1 for [B, C] inputs, T tokens for [B, T, C]). The activation part is
counted per example (the paper's on-device setting trains with batch 1); a batch of B holds B·C^A_c.

Output-neuron selection (Velocity / NEq, the paper's baseline) updates dW[c'] = C·D·D values but needs the whole
input A (C·H·W per example) as soon as one neuron of the layer is updated; its own budget counts weights only.

Costs are integers (element counts); bytes are 4 per element (fp32).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from rankwise.errors import InvalidInputError

BYTES = 4  # fp32 elements
INPUT, OUTPUT = 1, 0  # the weight axis a selection slices: input channels (TraDy) or output neurons (Velocity)


@dataclass(frozen=True)
class LayerGeometry:
    """One eligible layer: `out_channels` C', `in_channels` C, `kernel` D·D (1 for linear), `in_positions` H·W of its
    input per example (rows per example for linear), `out_positions` H'·W' of its output."""

    name: str
    kind: str  # "conv" or "linear"
    out_channels: int
    in_channels: int
    kernel: int
    in_positions: int
    out_positions: int

    def units(self, axis: int = INPUT) -> int:
        """How many selectable units: input channels (axis 1) or output neurons (axis 0)."""
        return self.in_channels if axis == INPUT else self.out_channels

    def weight_cost(self, axis: int = INPUT) -> int:
        """C^W of one unit: C'·D·D for an input channel, C·D·D for an output neuron."""
        return (self.out_channels if axis == INPUT else self.in_channels) * self.kernel

    def activation_cost(self, axis: int = INPUT) -> int:
        """C^A of one input channel (H·W), or, for output neurons, of the whole input (C·H·W, paid once per layer)."""
        return self.in_positions if axis == INPUT else self.in_channels * self.in_positions

    def channel_cost(self) -> int:
        """Θ_space,c of one input channel: C'·D·D + H·W."""
        return self.weight_cost(INPUT) + self.activation_cost(INPUT)

    def full_cost(self) -> int:
        """Σ_c Θ_space,c over every input channel: the layer's whole weight derivative plus its whole input."""
        return self.in_channels * self.channel_cost()

    def dw_flops(self, channels: int) -> int:
        """Multiply-accumulates of dW for `channels` input channels (Θ_time,c = D²·C'·H'·W' each), per example."""
        return channels * self.kernel * self.out_channels * self.out_positions


def eligible(module: nn.Module) -> bool:
    """nn.Linear, or nn.Conv2d without groups, with zero padding given as numbers (what the sparse layers compute)."""
    if isinstance(module, nn.Linear):
        return True
    return (isinstance(module, nn.Conv2d) and module.groups == 1 and module.padding_mode == "zeros"
            and not isinstance(module.padding, str))


def why_not_eligible(module: nn.Module) -> str:
    if isinstance(module, nn.Conv2d):
        if module.groups != 1:
            return f"a grouped Conv2d (groups={module.groups}), whose input channels feed only their group"
        return "a Conv2d with non-zero or 'same'/'valid' padding"
    return f"a {type(module).__name__}, not an nn.Linear or nn.Conv2d"


def measure_geometry(module: nn.Module, names: Iterable[str], run_forward: Callable[[], object],
                     used_by_loss: bool = False) -> dict[str, LayerGeometry]:
    """The geometry of the named layers of `module`, read from their input and output shapes during one forward
    (`run_forward()`, in eval mode: no batch-norm update, no dropout). Layers the forward does not reach are left
    out. With `used_by_loss`, `run_forward()` returns a loss and layers whose output it does not depend on are left
    out too (BERT's pooler runs in every forward, but a mean-pooled head never reads it: its channels would spend
    budget on a gradient that never arrives); this costs one backward of the probe."""
    names = list(names)
    modules = dict(module.named_modules())
    shapes: dict[str, tuple[torch.Size, torch.Size]] = {}
    outputs: dict[str, torch.Tensor] = {}
    hooks = []
    for name in names:
        def record(m: nn.Module, args: tuple, out: torch.Tensor, name: str = name) -> None:
            if name not in shapes:
                shapes[name] = (args[0].shape, out.shape)
                outputs[name] = out
        hooks.append(modules[name].register_forward_hook(record))
    training = module.training
    flags = {n: modules[n].weight.requires_grad for n in names}
    module.eval()  # no batch-norm statistics update, no dropout: the probe must leave no trace
    try:
        if used_by_loss:
            for n in names:
                modules[n].weight.requires_grad_(True)  # so that every output is part of the graph
            loss = run_forward()
            reached = [n for n in names if n in outputs and outputs[n].requires_grad]
            grads = torch.autograd.grad(loss, [outputs[n] for n in reached], allow_unused=True) if reached else []
            used = {n for n, g in zip(reached, grads) if g is not None}
        else:
            with torch.no_grad():
                run_forward()
            used = set(shapes)
    finally:
        module.train(training)
        for h in hooks:
            h.remove()
        for n, flag in flags.items():
            modules[n].weight.requires_grad_(flag)
    return {name: geometry(name, getattr(modules[name], "original", modules[name]), *shapes[name])
            for name in names if name in used}


def geometry(name: str, layer: nn.Module, in_shape: torch.Size, out_shape: torch.Size) -> LayerGeometry:
    if isinstance(layer, nn.Conv2d):
        kh, kw = layer.kernel_size
        return LayerGeometry(name, "conv", layer.out_channels, layer.in_channels, kh * kw,
                             int(in_shape[-2] * in_shape[-1]), int(out_shape[-2] * out_shape[-1]))
    if isinstance(layer, nn.Linear):
        rows = 1
        for d in in_shape[1:-1]:
            rows *= int(d)
        return LayerGeometry(name, "linear", layer.out_features, layer.in_features, 1, rows, rows)
    raise InvalidInputError(f"{name} is {why_not_eligible(layer)}")


def full_cost(geometries: Mapping[str, LayerGeometry]) -> int:
    """Σ_i Σ_c Θ_space,c: the per-example cost of updating every input channel of every layer."""
    return sum(g.full_cost() for g in geometries.values())


def fill_budget(order: torch.Tensor, costs: torch.Tensor, budget: int) -> torch.Tensor:
    """Algorithm 1's fill: the longest prefix of `order` (unit positions int64 [N]) whose summed `costs` (int64,
    indexed by position) stays within `budget`; the unit after it would exceed the budget (or the order is used up)."""
    total = torch.cumsum(costs[order], 0)
    return order[: int((total <= budget).sum())]


def in_head(name: str, head: str) -> bool:
    return bool(head) and (name == head or name.startswith(head + "."))


def find_layers(module: nn.Module, head: str = "head") -> list[str]:
    """Names of the eligible layers of `module` outside its `head` (which is trained densely), in module order."""
    return [n for n, m in module.named_modules() if n and not in_head(n, head) and eligible(m)]
