"""The layer table: one `LayerSpec` per layer of `rankwise.nn`, read by the shared conformance test.

Every layer a method adds (LRNN, Lorsa, Mixture-of-Memories, IVQ, FRL, ...) is named in its registry record
(`LayerEntry(name, "rankwise.nn.<pkg>.spec")`), `LAYERS` is derived from the records, and
`tests/nn/test_layer_conformance.py` checks each one the same way: forward, backward, `state_dict` round trip, dtype
(float32 and float64) and device (CPU, the meta device for shapes, CUDA when present). A spec builds a *small*
instance, so the whole matrix stays fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from rankwise.registry.tables import layer_entries


@dataclass(frozen=True)
class LayerSpec:
    """How to build and feed one layer for the conformance test.

    build:   (seed) -> a small instance in float32; two seeds give different parameters.
    inputs:  (generator, dtype) -> positional inputs of the forward, e.g. (x [batch, seq, dim],).
    output:  picks the tensor to check from the forward's return value (default: the value itself).
    frozen:  parameter names expected to get no gradient (e.g. a fixed basis).
    """

    name: str
    method: str  # the registry slug of the method the layer implements
    build: Callable[[int], nn.Module]
    inputs: Callable[[torch.Generator, torch.dtype], tuple[torch.Tensor, ...]]
    output: Callable[[object], torch.Tensor] = lambda out: out  # noqa: E731
    frozen: tuple[str, ...] = ()
    meta_device: bool = True  # the forward runs on the meta device (shape propagation only)


def spec_from_module(name: str, method: str, module: str, **options: object) -> LayerSpec:
    """A LayerSpec whose `build` and `inputs` are `module`'s functions of those names, imported on first use (so
    importing the registry imports no layer code)."""

    def build(seed: int) -> nn.Module:
        return importlib.import_module(module).build(seed)

    def inputs(gen: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        return importlib.import_module(module).inputs(gen, dtype)

    return LayerSpec(name, method, build, inputs, **options)


LAYERS: tuple[LayerSpec, ...] = tuple(spec_from_module(entry.name, slug, entry.spec, meta_device=entry.meta_device)
                                      for slug, entry in layer_entries())


def get_layer_spec(name: str) -> LayerSpec:
    from rankwise.errors import UnknownNameError

    for spec in LAYERS:
        if spec.name == name:
            return spec
    raise UnknownNameError(f"no layer {name!r} in rankwise.nn; registered: {[s.name for s in LAYERS]}")
