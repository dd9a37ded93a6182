"""Precomputed quantized base weights: every (layer, option) quantized once, a configuration assembled by lookup.

Quantizing the base per step would dominate training (card pitfall), so the bank quantizes each adapted layer's
original weight under every option of the space up front and keeps the codebook form (uint8 codes + block scales,
`rankwise.quant.codebook.CodebookTensor`); `apply(config)` dequantizes the chosen option per layer (a table lookup
and a multiply) into the layer's base weight, and sets a CoA-LoRA adapter's configuration to match. `restore()`
puts the original weights back bit for bit. The per-(layer, option) squared error ||W - Q(W)||_F^2 is the ILP's cost.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from rankwise.adapters.base import AdaptedLinear
from rankwise.adapters.coa_lora import CoaLoraAdapter
from rankwise.core.progress import progress
from rankwise.errors import InvalidInputError
from rankwise.quant.codebook import CodebookTensor, quantize_codebook
from rankwise.recipes.coa_lora.space import ConfigSpace, Configuration, Option, recipe_of

DEFAULT_MAX_BANK_GIB = 4.0


def adapted_layers(module: nn.Module) -> dict[str, AdaptedLinear]:
    """The AdaptedLinear layers of `module` (an AdaptedModel, or a task wrapper around one), in module order."""
    layers = {n: m for n, m in module.named_modules() if isinstance(m, AdaptedLinear)}
    if not layers:
        raise InvalidInputError("coa-lora: the module has no adapted linear layers to quantize; add an adapter first "
                                "(--method coa-lora or lora)")
    return layers


def space_for(module: nn.Module, choices: Sequence[Sequence]) -> ConfigSpace:
    """The configuration space over `module`'s adapted layers with these knob choices."""
    layers = adapted_layers(module)
    return ConfigSpace(tuple(layers), tuple(m.base_layer.weight.numel() for m in layers.values()),
                       tuple(tuple(c) for c in choices))


class QuantizedBank:
    """Every adapted layer of `module` quantized under every option of `space` (see the module docstring)."""

    def __init__(self, module: nn.Module, space: ConfigSpace, max_gib: float = DEFAULT_MAX_BANK_GIB,
                 reuse: QuantizedBank | None = None) -> None:
        self.layers = adapted_layers(module)
        if tuple(self.layers) != space.layers:
            raise InvalidInputError("the configuration space was built for other layers than this module's adapted ones")
        if any(m.merged for m in self.layers.values()):
            raise InvalidInputError("coa-lora: unmerge the adapters before quantizing the base (a merged delta would be quantized)")
        need = sum(n * (1 + 4 / o[3]) for n in space.sizes for o in space.options) / 2**30
        if need > max_gib:
            raise InvalidInputError(f"precomputing {len(space.options)} options for {space.n_layers} layers needs ~{need:.1f} GiB "
                                    f"(limit {max_gib} GiB): narrow the knob choices or adapt fewer layers")
        self.space = space
        self.original = {n: m.base_layer.weight.detach().clone() for n, m in self.layers.items()}
        self.current: Configuration | None = None
        if reuse is not None:  # another module with the same base weights (an experiment's arms): share the codes
            if reuse.space != space or any(not torch.equal(reuse.original[n], w) for n, w in self.original.items()):
                raise InvalidInputError("a bank can only be reused for the same space and identical base weights")
            self.codes, self.errors = reuse.codes, reuse.errors
            return
        self.codes: dict[tuple[str, Option], CodebookTensor] = {}
        errors = np.zeros((space.n_layers, len(space.options)))
        jobs = [(i, n, k, o) for i, n in enumerate(space.layers) for k, o in enumerate(space.options)]
        for i, name, k, option in progress(jobs, desc="coa-lora: quantize options"):
            w = self.original[name]
            q = quantize_codebook(w, recipe_of(option))
            self.codes[(name, option)] = q
            errors[i, k] = float((q.dequantize().double() - w.double()).square().sum())
        self.errors = errors  # [N, K] squared Frobenius error per layer and option

    def weight(self, name: str, option: Option) -> torch.Tensor:
        """The dequantized weight [out, in] of layer `name` under `option`."""
        return self.codes[(name, tuple(option))].dequantize()

    @torch.no_grad()
    def apply(self, config: Sequence) -> Configuration:
        """Quantize every layer's base per `config` (one option per layer) and set CoA-LoRA adapters to it."""
        config = self.space.check(config)
        for (name, layer), option in zip(self.layers.items(), config):
            layer.base_layer.weight.copy_(self.weight(name, option))
            for adapter in layer.adapters.values():
                if isinstance(adapter, CoaLoraAdapter):
                    adapter.set_option(option)
        self.current = config
        return config

    @torch.no_grad()
    def restore(self) -> None:
        """The original (unquantized) base weights, exactly."""
        for name, layer in self.layers.items():
            layer.base_layer.weight.copy_(self.original[name])
        self.current = None
