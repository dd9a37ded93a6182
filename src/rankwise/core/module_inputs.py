"""What named modules receive in one forward: a probe that several methods' procedures and experiments share (layer
geometries, input shapes, the activations a rank is chosen from)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn


def first_inputs(modules: Mapping[str, nn.Module], forward: Callable[[], Any],
                 keep: Callable[[torch.Tensor], Any] = torch.Tensor.detach) -> dict[str, Any]:
    """{name: keep(x)} for the first positional input x each of `modules` receives while `forward()` runs once under
    `torch.no_grad()`; modules the forward does not reach are absent. `keep` says what to hold (default: the
    detached tensor; `lambda x: x.shape` holds only its shape). The hooks are removed whatever happens; the module's
    train/eval mode is the caller's to set."""
    seen: dict[str, Any] = {}

    def hook_for(name: str) -> Callable[[nn.Module, tuple], None]:
        def hook(_module: nn.Module, args: tuple) -> None:  # returns None: the input goes on unchanged
            if name not in seen:
                seen[name] = keep(args[0])
        return hook

    handles = [m.register_forward_pre_hook(hook_for(n)) for n, m in modules.items()]
    try:
        with torch.no_grad():
            forward()
    finally:
        for h in handles:
            h.remove()
    return seen
