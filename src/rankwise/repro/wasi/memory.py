"""Measured training memory of chosen layers: the bytes autograd saves during each layer's own forward (its
activation memory, parameters excluded) and the bytes of the parameters and buffers the layer holds (its weight
memory), for one training step. The analytic counts (`recipes.wasi.cost`) are checked against these.

The saved tensors are caught with `torch.autograd.graph.saved_tensors_hooks`, entered by a forward pre-hook of the
layer and left by its forward hook, so what another layer saves is not counted; each storage counts once at its
full size (a view of a saved input costs the input).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn


def measured_layer_bytes(module: nn.Module, names: list[str], step: Callable[[], torch.Tensor]) -> dict[str, dict[str, int]]:
    """{name: {"activations": saved bytes (parameters excluded), "weights": bytes of the layer's parameters and
    buffers}} while `step()` (a training forward returning the loss) runs; the backward is run too, so a layer whose
    forward allocates lazily is measured as in training. The module's gradients are cleared afterwards."""
    layers = {n: module.get_submodule(n) for n in names}
    saved: dict[str, dict[int, int]] = {n: {} for n in names}
    contexts: dict[str, object] = {}
    handles = []
    for name, layer in layers.items():
        own = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        own |= {b.untyped_storage().data_ptr() for b in layer.buffers()}

        def pack(t: torch.Tensor, name: str = name, own: set[int] = own) -> torch.Tensor:
            s = t.untyped_storage()
            if s.data_ptr() not in own:
                saved[name][s.data_ptr()] = s.nbytes()
            return t

        def enter(_m: nn.Module, _args: tuple, name: str = name, pack=pack) -> None:
            ctx = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            ctx.__enter__()
            contexts[name] = ctx

        def leave(_m: nn.Module, _args: tuple, _out: object, name: str = name) -> None:
            contexts.pop(name).__exit__(None, None, None)

        handles += [layer.register_forward_pre_hook(enter), layer.register_forward_hook(leave)]
    try:
        step().backward()
    finally:
        for h in handles:
            h.remove()
        for p in module.parameters():
            p.grad = None
    return {n: {"activations": sum(saved[n].values()),
                "weights": sum(p.numel() * p.element_size() for p in layers[n].parameters())
                + sum(b.numel() * b.element_size() for b in layers[n].buffers())} for n in names}


def totals(per_layer: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """The per-layer counts summed: {"activations", "weights", "total"}."""
    acts = sum(v["activations"] for v in per_layer.values())
    weights = sum(v["weights"] for v in per_layer.values())
    return {"activations": acts, "weights": weights, "total": acts + weights}
