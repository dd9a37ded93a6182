"""The arms of the WASI experiments, built on a copy of one pretrained module whose target linears (the MLP
linears) and task head are what every arm trains.

- vanilla: the target linears trained densely (backprop keeps their inputs), plus the head;
- lora: the targets frozen with a rank-r LoRA each (the library's LoraAdapter), plus the head;
- svd-lora (the SVD-LLM stand-in): each target replaced by its truncated SVD at the WASI rank K (eps_high), frozen,
  with a rank-r LoRA on top: SVD-LLM's truncation-aware whitening is not reproduced, its "compress, then adapt" is;
- wsi / asi: WASI's weight half only (dense activations) / activation half only (dense weight);
- wasi-<eps>: the paper's WASI (dense master W) at a weight and activation threshold eps;
- wasi-lowmem: the low-memory variant (only L, R and the Tucker factors exist) at eps_high;
- head-only: the negative control (the backbone frozen: does this testbed need the layers WASI trains?).

Every arm starts from the same head initialisation for a given seed and trains with the same loop, optimizer (SGD,
as the paper), schedule and clipping; only the learning rate is tuned per arm.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rankwise.adapters import AdaptedLinear, AdapterSite, LoraAdapter, LoraConfig, SharedParameters
from rankwise.core.training import Procedure, TrainConfig, train
from rankwise.recipes.wasi import LinearGeometry, WasiProcedure, build, initial_factors, memory_numel, training_flops

ADAPTER = "default"


@dataclass(frozen=True)
class ArmSpec:
    name: str
    label: str
    options: dict[str, Any] | None = None  # WasiConfig fields (WASI arms), None for the others


def arm_specs(eps_low: float, eps_high: float) -> list[ArmSpec]:
    """The arms in report order (the WASI ones with their procedure options)."""
    paper = {"variant": "paper"}
    return [
        ArmSpec("vanilla", "vanilla (dense backprop)"),
        ArmSpec("lora", "LoRA"),
        ArmSpec("svd-lora", f"SVD truncation (eps {eps_high}) + LoRA"),
        ArmSpec("wsi", f"WSI only (eps {eps_high})", {**paper, "compress": "weights", "epsilon": eps_high}),
        ArmSpec("asi", f"ASI only (eps {eps_high})", {**paper, "compress": "activations", "epsilon": eps_high}),
        ArmSpec("wasi-low", f"WASI (eps {eps_low})", {**paper, "epsilon": eps_low}),
        ArmSpec("wasi-high", f"WASI (eps {eps_high})", {**paper, "epsilon": eps_high}),
        ArmSpec("wasi-lowmem", f"WASI low-memory (eps {eps_high})", {"variant": "low-memory", "epsilon": eps_high}),
        ArmSpec("head-only", "head only (frozen backbone; control)"),
    ]


def _lora(base: nn.Linear, name: str, r: int) -> AdaptedLinear:
    site = AdapterSite(name, name, None, base, ADAPTER, SharedParameters())
    wrapped = AdaptedLinear(base)
    wrapped.adapters[ADAPTER] = LoraAdapter(site, LoraConfig(r=r, lora_alpha=float(2 * r), target_modules=[name]))
    wrapped.active = (ADAPTER,)
    return wrapped


def _set(module: nn.Module, name: str, child: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, attr, child)


def svd_truncated(linear: nn.Linear, epsilon: float) -> nn.Linear:
    """A copy of `linear` whose weight is its truncated SVD at explained variance `epsilon` (WASI's K)."""
    out = copy.deepcopy(linear)
    l, r = initial_factors(linear.weight, epsilon)
    with torch.no_grad():
        out.weight.copy_(l @ r)
    return out


def prepare(spec: ArmSpec, base: nn.Module, targets: Sequence[str], task: Any, seed: int, lora_rank: int,
            eps_high: float) -> tuple[nn.Module, WasiProcedure | None]:
    """A fresh copy of `base` set up for arm `spec` (its head re-initialised from `seed`), and its procedure."""
    module = copy.deepcopy(base)
    module.requires_grad_(False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module.head.reset_parameters()
    module.head.requires_grad_(True)
    procedure = None
    if spec.options is not None:
        procedure = build(module, task, seed, targets=",".join(targets), **spec.options)
    elif spec.name == "vanilla":
        for name in targets:
            module.get_submodule(name).requires_grad_(True)
    elif spec.name in ("lora", "svd-lora"):
        for name in targets:
            linear = module.get_submodule(name)
            if spec.name == "svd-lora":
                linear = svd_truncated(linear, eps_high)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed * 1009 + sum(map(ord, name)))
                _set(module, name, _lora(linear, name, lora_rank))
    return module, procedure


def sgd(momentum: float = 0.0):
    """The paper's optimizer (SGD, momentum 0) with the config's learning rate and weight decay."""

    def make(module: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=config.lr, momentum=momentum,
                               weight_decay=config.weight_decay)

    make.label = f"sgd(momentum={momentum})"  # type: ignore[attr-defined]
    return make


def train_arm(module: nn.Module, procedure: Procedure | None, task: Any, config: TrainConfig):
    return train(module, task, config, optimizer=sgd(), procedure=procedure)


def geometry(spec: ArmSpec, module: nn.Module, targets: Sequence[str], procedure: WasiProcedure | None,
             lora_rank: int, batch: dict[str, torch.Tensor]) -> dict[str, tuple[LinearGeometry, tuple[int, int]]]:
    """Each target's analytic geometry and its input's (batch, tokens) in this arm, on `batch`."""
    if procedure is not None:
        return procedure.geometry(batch)
    out = {}
    for name in targets:
        layer = module.get_submodule(name)
        base = layer.base_layer if isinstance(layer, AdaptedLinear) else layer
        kind = "lora" if isinstance(layer, AdaptedLinear) else "vanilla"
        out[name] = LinearGeometry(base.out_features, base.in_features, base.bias is not None, kind,
                                   rank=lora_rank if kind == "lora" else 0)
    return out


def analytic_bytes(geo: dict, shapes: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Summed fp32 bytes {"activations", "weights" (the paper's count), "dense_master"} of the targets."""
    out = dict.fromkeys(("activations", "weights", "dense_master"), 0)
    for name, g in geo.items():
        g = g[0] if isinstance(g, tuple) else g
        b, n = shapes[name]
        for key, value in memory_numel(g, b, n).items():
            if key in out:
                out[key] += 4 * value
    return out


def analytic_flops(geo: dict, shapes: dict[str, tuple[int, int]]) -> int:
    total = 0
    for name, g in geo.items():
        g = g[0] if isinstance(g, tuple) else g
        b, n = shapes[name]
        total += sum(training_flops(g, b, n).values())
    return total
