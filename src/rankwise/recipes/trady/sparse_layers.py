"""Conv and linear layers whose weight gradient exists only for selected channels, and whose backward keeps only
what that gradient needs: the custom autograd functions that make TraDy's memory saving real.

A layer updates the input channels `index` of its weight W [C', C, D, D] (linear: [C', C]):
- forward: y = conv(x, W) (+ a frozen bias added outside the function, which saves nothing);
- saved for backward: the activation slice x[:, index] [B, k, H, W] (linear: x[..., index]) and a reference to W
  (the layer's own weight, no copy: it is needed to propagate dL/dx to the layers below);
- backward: dL/dx from W (every channel), and dW[:, index] from the slice alone, which is exactly the full gradient's
  columns: (dL/dW)[c', c] = Σ_{b, h', w'} x[b, c, ...] · dL/dy[b, c', h', w'] reads channel c of x only.
What trains is the slice [C', k, D, D] itself, a view of one flat parameter shared by the pool layers (so the
gradient and any optimizer state are as large as the budget, not the layers); its values are written into W before
each forward that follows an update.

`axis = 0` selects output neurons instead (Velocity / NEq): dW[index] = dL/dy[:, index] ⊗ x needs the whole input,
which is then saved in full (the reason the paper counts Velocity's activations at 60-80% of full backprop).

`probe = True` (the deterministic-RGN oracle's full-gradient pass) saves the whole input and records the per-channel
norms ‖dW[:, c]‖₂ of the full weight gradient in `probe_norms`, without producing any parameter gradient.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.grad import conv2d_input, conv2d_weight

from rankwise.recipes.trady.costs import INPUT


def _kept(x: torch.Tensor, index: torch.Tensor, axis: int, probe: bool, channel_dim: int) -> torch.Tensor | None:
    """What the backward needs of the input: nothing (no unit selected), the selected channels' slice, or all of it."""
    if probe or (axis != INPUT and index.numel()):
        return x
    if index.numel():
        return x.index_select(channel_dim, index)
    return None


class _SparseConv2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, selected: torch.Tensor | None, index: torch.Tensor,
                axis: int, probe: Any, stride: tuple, padding: tuple, dilation: tuple) -> torch.Tensor:
        y = F.conv2d(x, weight, None, stride, padding, dilation)
        trains = selected is not None and selected.requires_grad
        kept = _kept(x, index, axis, probe is not None, 1) if trains or probe is not None else None
        ctx.save_for_backward(kept, weight)
        ctx.index, ctx.axis, ctx.probe, ctx.conv = index, axis, probe, (stride, padding, dilation)
        ctx.x_shape, ctx.selected_shape = x.shape, None if selected is None else selected.shape
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple:
        kept, weight = ctx.saved_tensors
        stride, padding, dilation = ctx.conv
        grad_x = grad_selected = None
        if ctx.needs_input_grad[0]:
            grad_x = conv2d_input(ctx.x_shape, weight, grad_y, stride, padding, dilation)
        if ctx.probe is not None:
            full = conv2d_weight(kept, weight.shape, grad_y, stride, padding, dilation)
            ctx.probe.record(full)
        if ctx.needs_input_grad[2]:
            index, shape = ctx.index, ctx.selected_shape
            if not index.numel():
                grad_selected = grad_y.new_zeros(shape)
            elif ctx.axis == INPUT:
                slice_ = kept if ctx.probe is None else kept.index_select(1, index)
                grad_selected = conv2d_weight(slice_, shape, grad_y, stride, padding, dilation)
            else:
                grad_selected = conv2d_weight(kept, shape, grad_y.index_select(1, index), stride, padding, dilation)
        return grad_x, None, grad_selected, None, None, None, None, None, None


class _SparseLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, selected: torch.Tensor | None, index: torch.Tensor,
                axis: int, probe: Any) -> torch.Tensor:
        y = F.linear(x, weight)
        trains = selected is not None and selected.requires_grad
        kept = _kept(x, index, axis, probe is not None, x.dim() - 1) if trains or probe is not None else None
        ctx.save_for_backward(kept, weight)
        ctx.index, ctx.axis, ctx.probe = index, axis, probe
        ctx.selected_shape = None if selected is None else selected.shape
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple:
        kept, weight = ctx.saved_tensors
        grad_x = grad_selected = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_y @ weight
        g = grad_y.reshape(-1, grad_y.size(-1))  # [rows, C']
        if ctx.probe is not None:
            ctx.probe.record(g.t() @ kept.reshape(-1, kept.size(-1)))
        if ctx.needs_input_grad[2]:
            index = ctx.index
            if not index.numel():
                grad_selected = grad_y.new_zeros(ctx.selected_shape)
            elif ctx.axis == INPUT:
                slice_ = kept if ctx.probe is None else kept.index_select(-1, index)
                grad_selected = g.t() @ slice_.reshape(-1, slice_.size(-1))  # [C', k]
            else:
                grad_selected = g.index_select(1, index).t() @ kept.reshape(-1, kept.size(-1))  # [k, C]
        return grad_x, None, grad_selected, None, None, None


class ProbeNorms:
    """Accumulates ‖dW[:, c]‖₂ per input channel (float64 [C]) over the probe batches of one pass."""

    def __init__(self, channels: int) -> None:
        self.sum = torch.zeros(channels, dtype=torch.float64)
        self.batches = 0

    def record(self, grad_w: torch.Tensor) -> None:
        g = grad_w.detach().double().transpose(0, 1).reshape(grad_w.size(1), -1)  # [C, C'·D·D]
        self.sum += g.norm(dim=1)
        self.batches += 1

    def mean(self) -> torch.Tensor:
        return self.sum / max(1, self.batches)


class ChannelSparse(nn.Module):
    """A conv or linear layer (the one it replaces is kept, to be put back) that trains only the units `index`
    along `axis`.

    Buffers: `weight` (the dense weight, the same storage as the original layer's) and `bias` (frozen). A pool layer
    (`trainable`) reads its trained slice from a flat parameter shared by all pool layers (`attach(bank)`), at
    `offset`: the slice of `index` along `axis`, [C', k, D, D] for input channels. One flat parameter of fixed size
    (the budget) rather than one per layer, because a parameter whose shape changed between draws would no longer
    match what autograd recorded for it. A frozen layer saves no activation for a weight gradient at all; it only
    passes dL/dx down."""

    def __init__(self, layer: nn.Linear | nn.Conv2d, trainable: bool, axis: int = INPUT) -> None:
        super().__init__()
        object.__setattr__(self, "original", layer)  # not a submodule: its weight is `weight` here
        object.__setattr__(self, "bank", None)  # the shared flat parameter (registered on the trained module)
        self.conv = isinstance(layer, nn.Conv2d)
        self.axis, self.trainable = axis, trainable
        self.register_buffer("weight", layer.weight.detach())
        self.register_buffer("bias", None if layer.bias is None else layer.bias.detach())
        self.index = torch.zeros(0, dtype=torch.long)
        self.offset = 0
        self._synced: int | None = None
        self.probe: ProbeNorms | None = None

    @property
    def units(self) -> int:
        return int(self.weight.shape[self.axis])

    def attach(self, bank: nn.Parameter) -> None:
        object.__setattr__(self, "bank", bank)
        self._synced = bank._version

    def slice_shape(self) -> list[int]:
        shape = list(self.weight.shape)
        shape[self.axis] = int(self.index.numel())
        return shape

    def slice_numel(self) -> int:
        return math.prod(self.slice_shape())

    def trained_slice(self) -> torch.Tensor:
        """The trained slice, a view of the bank: [C', k, D, D] (linear [C', k]; output neurons [k, C, D, D])."""
        return self.bank[self.offset : self.offset + self.slice_numel()].view(self.slice_shape())

    def sync(self) -> None:
        """Write the trained slice into the dense weight if an update changed the bank since the last write."""
        bank = self.bank
        if bank is None or bank._version == self._synced:
            return
        if self.index.numel():
            with torch.no_grad():
                self.weight.index_copy_(self.axis, self.index, self.trained_slice().detach())
        self._synced = bank._version

    def place(self, index: torch.Tensor, offset: int) -> int:
        """Train the units `index` (int64) from now on, their slice at `offset` of the bank, starting from the
        current weights (the caller syncs every layer first and marks them synced after). Returns the slice size."""
        self.index, self.offset = index.to(torch.long).sort().values, int(offset)
        n = self.slice_numel()
        if n:
            with torch.no_grad():
                self.bank[offset : offset + n].copy_(self.weight.index_select(self.axis, self.index).reshape(-1))
        return n

    def mark_synced(self) -> None:
        if self.bank is not None:
            self._synced = self.bank._version

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.sync()
        trains = self.trainable and self.bank is not None and self.bank.requires_grad
        if not torch.is_grad_enabled() or not (x.requires_grad or trains or self.probe is not None):
            y = self._dense(x)
        else:
            # A pool layer always hands its (possibly empty) slice to the function, so that its backward runs.
            selected = self.trained_slice() if trains else None
            if self.conv:
                c = self.original
                y = _SparseConv2d.apply(x, self.weight, selected, self.index, self.axis, self.probe,
                                        c.stride, c.padding, c.dilation)
            else:
                y = _SparseLinear.apply(x, self.weight, selected, self.index, self.axis, self.probe)
        if self.bias is None:
            return y
        return y + (self.bias.view(1, -1, 1, 1) if self.conv else self.bias)

    def _dense(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv:
            c = self.original
            return F.conv2d(x, self.weight, None, c.stride, c.padding, c.dilation)
        return F.linear(x, self.weight)

    def restore(self) -> nn.Module:
        """The original layer, its weight holding every update (it shares this layer's weight storage)."""
        self.sync()
        return self.original

    def extra_repr(self) -> str:
        kind = "conv" if self.conv else "linear"
        unit = "input channels" if self.axis == INPUT else "output neurons"
        what = f"{self.index.numel()}/{self.units} {unit}" if self.trainable else "frozen"
        return f"{kind} {tuple(self.weight.shape)}, training {what}"


def swap(module: nn.Module, name: str, replacement: nn.Module) -> None:
    """Put `replacement` where the submodule `name` of `module` is."""
    parent_name, _, child = name.rpartition(".")
    parent = module.get_submodule(parent_name) if parent_name else module
    setattr(parent, child, replacement)
