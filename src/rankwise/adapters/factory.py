"""From a method name and a few knobs to an adapted model: what the CLI and the reproductions call.

Every adapter type of `types.ADAPTER_TYPES` is a method here (`available_methods()`). Its config is built from
(rank, targets, layers) plus any method-specific fields given as `options`; methods that need calibration
statistics get second moments of the targeted layers' inputs over `calibration_batches` (token-id tensors the caller
builds: this package does not load data).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from rankwise.adapters.config import AdapterConfig, find_targets
from rankwise.adapters.model import AdaptedModel, add_adapter
from rankwise.adapters.types import ADAPTER_TYPES, adapter_type
from rankwise.core.calibration import collect_second_moments
from rankwise.errors import InvalidInputError

# Default targets: PiCa's (and the usual LoRA) choice of attention and MLP projections for each architecture.
DEFAULT_TARGETS = {
    "llama": ["q_proj", "k_proj", "v_proj", "up_proj", "down_proj"],
    "bert": ["query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense"],
}


# Config fields build_config sets from its own arguments (named as the CLI names them): never method options.
RESERVED_OPTIONS = {"r": "rank argument (--rank)", "target_modules": "targets argument (--targets / --targets-regex)",
                    "layers_to_transform": "top_k_layers argument (--top-k-layers)"}


def available_methods() -> list[str]:
    return sorted(ADAPTER_TYPES)


def default_targets(model: nn.Module) -> list[str]:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in DEFAULT_TARGETS:
        raise InvalidInputError(f"no default target modules for model type {model_type!r}: pass targets explicitly")
    return list(DEFAULT_TARGETS[model_type])


def top_layers(model: nn.Module, k: int | None) -> list[int] | None:
    """Indices of the top `k` transformer layers (None: all layers)."""
    if k is None:
        return None
    n = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if n is None:
        raise InvalidInputError("cannot find the number of layers (config.num_hidden_layers) to select the top K")
    if not 1 <= k <= n:
        raise InvalidInputError(f"top-K layers must be between 1 and {n} for this model, got {k}")
    return list(range(n - k, n))


def build_config(method: str, rank: int, targets: list[str] | str, layers: list[int] | None = None, **options: Any) -> AdapterConfig:
    cls = adapter_type(method)
    fields = {f.name for f in dataclasses.fields(cls.config_class)}  # not the ClassVar `method`
    for key, argument in RESERVED_OPTIONS.items():
        if key in options:
            raise InvalidInputError(f"option {key!r} is set by the {argument}, not as a method option")
    unknown = sorted(set(options) - fields)
    if unknown:
        raise InvalidInputError(f"method {method!r} has no option(s) {unknown}; its options are {sorted(fields)}")
    return cls.config_class(r=rank, target_modules=targets, layers_to_transform=layers, **options)


def adapt(
    model: nn.Module,
    method: str,
    rank: int,
    targets: list[str] | str | None = None,
    top_k_layers: int | None = None,
    calibration_batches: Iterable[torch.Tensor] | None = None,
    adapter_name: str = "default",
    **options: Any,
) -> AdaptedModel:
    """Inject adapter `method` of rank `rank` into `model` (default targets for its architecture, optionally only
    in its top K layers) and return the AdaptedModel with only the adapter trainable."""
    config = build_config(method, rank, targets or default_targets(model), top_layers(model, top_k_layers), **options)
    statistics: Mapping | None = None
    if adapter_type(method).needs_statistics:
        if calibration_batches is None:
            raise InvalidInputError(f"method {method!r} needs calibration data: pass calibration_batches (token id tensors)")
        statistics = collect_second_moments(model, find_targets(model, config), list(calibration_batches))
    return add_adapter(model, config, adapter_name, statistics)
