"""The adapter layer machinery every method shares.

`AdaptedLinear` replaces a targeted `nn.Linear`. It keeps the base layer untouched and holds any number of named
`Adapter`s; its output is `base(x) + sum(adapter(x) for active, unmerged adapters)`. Every method is written as an
additive update on top of the *unchanged* base weight (PiSSA's residual, GuardSpace's `W - B0 A0 P`, ... are
expressed as `delta = new - initial`), which is what makes disable, delete, several adapters and exact
merge/unmerge work the same way for all of them.

An adapter type is an `Adapter` subclass with a `method` name, listed in `types.ADAPTER_TYPES`. It implements:
  __init__(site, config, initialize)   build parameters for one layer; `initialize=False` only allocates shapes
                                       (the loader fills them), so expensive inits (SVD, calibration) are skipped;
  forward(x) -> delta output           x [..., in] -> [..., out], added to the base output;
  delta_weight() -> [out, in]          the weight change merge adds;
  lora_factors() -> LoraFactors|None   the deployed form as a LoRA delta (B @ A * scaling), for PEFT export.
Parameters shared across layers (PiCa's per-module-type matrix) come from `site.shared`, which owns them once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.adapters.config import AdapterConfig
from rankwise.core.calibration import SecondMoment
from rankwise.errors import InvalidInputError

@dataclass(frozen=True)
class LoraFactors:
    """A weight delta in LoRA form: delta = scaling * B @ A, with A [r, in] and B [out, r]."""

    A: torch.Tensor
    B: torch.Tensor
    scaling: float

    @property
    def rank(self) -> int:
        return self.A.size(0)


class SharedParameters(nn.Module):
    """Owns parameters that several layers use (each exactly once in the model's state and optimizer).

    Keys are free-form strings (a module type such as `model.layers.*.self_attn.q_proj`); they are escaped because
    `nn.ParameterDict` keys may not contain dots.
    """

    def __init__(self) -> None:
        super().__init__()
        self.params = nn.ParameterDict()

    @staticmethod
    def escape(key: str) -> str:
        return key.replace("~", "~t").replace(".", "~d").replace("*", "~s")

    @staticmethod
    def unescape(key: str) -> str:
        return key.replace("~s", "*").replace("~d", ".").replace("~t", "~")

    def get_or_create(self, key: str, factory: Callable[[], torch.Tensor]) -> nn.Parameter:
        k = self.escape(key)
        if k not in self.params:
            self.params[k] = nn.Parameter(factory())
        return self.params[k]

    def drop(self, prefix: str) -> None:
        for k in [k for k in self.params if self.unescape(k).startswith(prefix)]:
            del self.params[k]


@dataclass
class AdapterSite:
    """Everything an adapter may use to build itself for one layer."""

    module_name: str  # full name in the model, e.g. model.layers.3.self_attn.q_proj
    module_type: str  # the name with the layer index replaced by '*': layers of one kind share it
    layer_index: int | None
    base: nn.Linear
    adapter_name: str
    shared: SharedParameters  # parameters shared across layers, for this model
    statistics: SecondMoment | None = None  # calibration second moment of this layer's input, if the method needs it

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def shared_parameter(self, key: str, factory: Callable[[], torch.Tensor]) -> nn.Parameter:
        """A parameter shared by every layer of this adapter that asks for the same `key`."""
        return self.shared.get_or_create(f"{self.adapter_name}/{key}", factory)


class Adapter(nn.Module):
    """One named adapter on one linear layer. See the module docstring for what subclasses implement."""

    method: ClassVar[str] = ""
    config_class: ClassVar[type[AdapterConfig]] = AdapterConfig
    needs_statistics: ClassVar[bool] = False  # True: the model passes calibration second moments per layer

    def __init__(self, site: AdapterSite, config: AdapterConfig, initialize: bool = True) -> None:
        super().__init__()
        self.module_name = site.module_name
        self.max_rank_check(site, config)
        # Shared parameters are owned by SharedParameters; we hold plain references (not registered here) so each
        # appears once in state dicts and parameter lists. Name -> key in the shared store, for saving.
        self._shared: dict[str, nn.Parameter] = {}

    @classmethod
    def max_rank(cls, site: AdapterSite) -> int:
        return min(site.in_features, site.out_features)

    @classmethod
    def max_rank_check(cls, site: AdapterSite, config: AdapterConfig) -> None:
        limit = cls.max_rank(site)
        if config.r > limit:
            raise InvalidInputError(
                f"{cls.method} rank r={config.r} exceeds min(in, out)={limit} of {site.module_name} "
                f"({site.in_features} -> {site.out_features}); use r <= {limit} or exclude that module"
            )

    def use_shared(self, attr: str, param: nn.Parameter) -> None:
        object.__setattr__(self, attr, param)  # bypass nn.Module registration on purpose (see __init__)
        self._shared[attr] = param

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def delta_weight(self) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def lora_factors(self) -> LoraFactors | None:
        """The deployed delta as LoRA factors, or None when it is not a low-rank delta (then no PEFT export)."""
        return None

    def prepare_load(self, state: Mapping[str, torch.Tensor]) -> None:
        """Called by the loader with this layer's saved tensors (keys relative to the layer) before it fills them:
        a method whose frozen state has a data-dependent shape (GuardSpace's null-space basis) resizes it here."""


class AdaptedLinear(nn.Module):
    """A linear layer with named adapters. The base layer's weight is only changed by `merge`, exactly undone by
    `unmerge` (the pre-merge weight is kept, so unmerge restores it bit for bit)."""

    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.base_layer = base
        self.adapters = nn.ModuleDict()
        self.active: tuple[str, ...] = ()
        self.merged: tuple[str, ...] = ()
        self.disabled = False
        self._pre_merge_weight: torch.Tensor | None = None

    @property
    def weight(self) -> torch.Tensor:
        return self.base_layer.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base_layer.bias

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.disabled and self.merged:
            return F.linear(x, self._pre_merge_weight, self.base_layer.bias)
        out = self.base_layer(x)
        if self.disabled:
            return out
        for name in self.active:
            if name not in self.merged and name in self.adapters:
                out = out + self.adapters[name](x)
        return out

    @torch.no_grad()
    def merge(self, names: tuple[str, ...]) -> None:
        """Add the deltas of `names` (not yet merged) into the base weight. Merging twice changes nothing."""
        todo = [n for n in names if n in self.adapters and n not in self.merged]
        if not todo:
            return
        if self._pre_merge_weight is None:
            self._pre_merge_weight = self.base_layer.weight.detach().clone()
        w = self.base_layer.weight
        for n in todo:
            w.add_(self.adapters[n].delta_weight().to(w.dtype))
        self.merged = self.merged + tuple(todo)

    @torch.no_grad()
    def unmerge(self) -> None:
        """Restore the exact pre-merge weight. Unmerging an unmerged layer changes nothing."""
        if self._pre_merge_weight is not None:
            self.base_layer.weight.copy_(self._pre_merge_weight)
        self._pre_merge_weight = None
        self.merged = ()

    def extra_repr(self) -> str:
        return f"active={list(self.active)}, merged={list(self.merged)}, disabled={self.disabled}"
