"""WASI as a training procedure: the target linears (default: every MLP linear) are replaced in place by
`WasiLinear` layers when the procedure is built, and after every optimizer step each takes one WSI step.

    rankwise finetune --model minilm-l6 --task wiki-topics --method full --procedure wasi \\
        --procedure-option epsilon=0.9 --out runs/wasi
    rankwise finetune --model tiny-vit-fmnist-0to4 --task fashion-mnist-5to9 --method full --procedure wasi \\
        --procedure-option variant=paper --procedure-option budget_mb=0.5 --out runs/wasi-vit

So a plain step of the loop -- `before_micro_batch`; `loss = task.loss(module, batch)`; `loss.backward()`;
`optimizer.step()`; `after_step(...)` -- is WASI's training step: the layers save only their Tucker factors and
L, R for the backward (variant "low-memory": no dense W exists at all), and `after_step` refreshes the subspaces.

Options (`WasiConfig`): the weight threshold `epsilon` (K fixed from it at build time), the activation threshold
(default: the same), or a memory budget for the activations that the knapsack search (`rank_search`) fills on one
calibration batch; `variant` "low-memory" (L, R trained, the update projected on the rank-K tangent space) or
"paper" (dense master W, as the paper evaluated it); `compress` "both" (WASI), "weights" (WSI only) or
"activations" (ASI only). Unless `train_others`, every parameter outside the WASI layers except the task's head
(`module.head`) is frozen, as the paper trains its WASI layers (and the classifier).

At the end of training every WasiLinear becomes an nn.Linear with W = L R (the compressed model the run validated;
the paper variant's dense master, which its forward never used, is not kept), so the saved folder loads like any other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from rankwise.core.module_inputs import first_inputs
from rankwise.core.options import config_or_options, option
from rankwise.core.training import Procedure
from rankwise.core.training.loop import batch_indices
from rankwise.errors import InvalidInputError
from rankwise.recipes.wasi.cost import LinearGeometry, memory_numel, training_flops
from rankwise.recipes.wasi.functions import EXACT, TUCKER
from rankwise.recipes.wasi.layer import WasiLinear
from rankwise.recipes.wasi.rank_search import RankOption, choose_options, measure_options
from rankwise.recipes.wasi.spectrum import check_epsilon
from rankwise.recipes.wasi.tucker import as_3d, hosvd_bases

# MLP linears by architecture: BERT's intermediate.dense and (FFN) output.dense, not attention.output.dense; the
# mlp.* linears of ViTs, Llama-style decoders (gate/up/down_proj) and GPT-style ones (c_fc, c_proj).
MLP_PATTERN = re.compile(r"(^|\.)(intermediate\.dense|(?<!attention\.)output\.dense|mlp\.[A-Za-z0-9_]+)$")
SEARCH_GRID = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # the authors' candidate thresholds
VARIANTS = {"low-memory": "factored", "paper": "master"}
COMPRESS = ("both", "weights", "activations")


@dataclass(frozen=True)
class WasiConfig:
    """WASI's options. `epsilon`: the weights' explained-variance threshold in (0, 1]; `activation_epsilon`: the
    activations' (None: `epsilon`); `budget_mb`: instead, a budget in MiB (2^20 bytes) for all the layers' Tucker
    factors, filled by the knapsack over `epsilons` on `calibration_examples` examples (use the training batch size:
    the batch mode's rank is measured on that many); `variant`, `compress`, `targets` ("mlp", or comma-separated
    module-name suffixes such as "fc1,fc2" or "layer.5.intermediate.dense"), `train_others`."""

    epsilon: float = 0.9
    activation_epsilon: float | None = None
    variant: str = field(default="low-memory", metadata=option(choices=tuple(VARIANTS)))
    compress: str = field(default="both", metadata=option(choices=COMPRESS))
    targets: str = "mlp"
    budget_mb: float | None = None
    epsilons: tuple[float, ...] = SEARCH_GRID
    calibration_examples: int = 32
    train_others: bool = False

    def validate(self) -> None:
        check_epsilon(self.epsilon)
        if self.activation_epsilon is not None:
            check_epsilon(self.activation_epsilon, "activation_epsilon")
        for e in self.epsilons:
            check_epsilon(e, "each of epsilons")
        if not self.epsilons:
            raise InvalidInputError("epsilons (the rank search's candidate thresholds) must not be empty")
        if self.budget_mb is not None and not self.budget_mb > 0:
            raise InvalidInputError(f"budget_mb must be a positive number of MiB, got {self.budget_mb}")
        if self.budget_mb is not None and self.compress == "weights":
            raise InvalidInputError("budget_mb sets the activations' Tucker ranks; with compress=weights there are none")
        if self.budget_mb is not None and self.activation_epsilon is not None:
            raise InvalidInputError("give activation_epsilon or budget_mb (the rank search), not both")
        if self.calibration_examples < 1:
            raise InvalidInputError(f"calibration_examples must be positive, got {self.calibration_examples}")
        if not isinstance(self.targets, str) or not self.targets.strip():
            raise InvalidInputError(f"targets must be 'mlp' or comma-separated module names, got {self.targets!r}")

    @property
    def weight_form(self) -> str:
        return "dense" if self.compress == "activations" else VARIANTS[self.variant]

    @property
    def activation_form(self) -> str:
        return EXACT if self.compress == "weights" else TUCKER


def find_targets(module: nn.Module, targets: str = "mlp") -> dict[str, nn.Linear]:
    """The linears WASI replaces, by module name: "mlp" (MLP_PATTERN) or comma-separated name suffixes, each of
    which must name at least one module, and every module named must be an nn.Linear (else a RankwiseError)."""
    named = dict(module.named_modules())
    if targets.strip() == "mlp":
        found = {n: m for n, m in named.items() if MLP_PATTERN.search(n) and isinstance(m, (nn.Linear, WasiLinear))}
    else:
        found = {}
        for suffix in (s.strip() for s in targets.split(",") if s.strip()):
            hits = {n: m for n, m in named.items() if n == suffix or n.endswith("." + suffix)}
            if not hits:
                raise InvalidInputError(f"WASI target {suffix!r} names no module of this model")
            wrong = {n: type(m).__name__ for n, m in hits.items() if not isinstance(m, (nn.Linear, WasiLinear))}
            if wrong:
                name, kind = next(iter(wrong.items()))
                raise InvalidInputError(f"WASI target {suffix!r} names {name!r}, a {kind}: WASI replaces nn.Linear "
                                        "layers only (name the linears, e.g. intermediate.dense or fc1)")
            found.update(hits)
    already = [n for n, m in found.items() if isinstance(m, WasiLinear)]
    if already:
        raise InvalidInputError(f"{already[0]!r} is already a WasiLinear: build the procedure on the original model")
    if not found:
        raise InvalidInputError(f"the model has no layer WASI can train for targets={targets!r} (no MLP linear: "
                                f"name the nn.Linear layers, e.g. targets=fc1,fc2)")
    return found


def _set(module: nn.Module, name: str, child: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, attr, child)


class WasiProcedure(Procedure):
    """The WASI layers of a module (by name), their one-step-per-iteration refresh, and the analytic counts."""

    name = "wasi"
    resumable = True  # the warm starts (Tucker factors, the paper variant's L and R) go into checkpoints

    def __init__(self, module: nn.Module, task: Any, layers: Mapping[str, WasiLinear], config: WasiConfig,
                 search: Mapping[str, list[RankOption]] | None = None, choice: Mapping[str, int] | None = None) -> None:
        self.module, self.task, self.config = module, task, config
        self.layers = dict(layers)
        self.search = dict(search or {})
        self.choice = dict(choice or {})
        self.finished = False

    def after_step(self, step: int, module: nn.Module, task: Any, batch: Mapping[str, torch.Tensor]) -> None:
        for layer in self.layers.values():
            layer.refresh()

    def end_of_training(self, module: nn.Module) -> None:
        if self.finished:
            return
        for name, layer in self.layers.items():
            _set(self.module, name, layer.to_linear())
        self.finished = True

    # ---- resume ---------------------------------------------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, layer in self.layers.items():
            if layer.weights == "master":
                out[f"{name}/L"], out[f"{name}/R"] = layer.L, layer.R
            if layer.activation is not None:
                out.update({f"{name}/act/{k}": v for k, v in layer.activation.state().items()})
        return out

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        for name, layer in self.layers.items():
            if layer.weights == "master" and f"{name}/L" in tensors:
                layer.L.copy_(tensors[f"{name}/L"])
                layer.R.copy_(tensors[f"{name}/R"])
            if layer.activation is not None:
                prefix = f"{name}/act/"
                layer.activation.load_state({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})

    def describe(self) -> dict[str, Any]:
        c = asdict(self.config)
        return {"procedure": self.name, **{f"wasi {k}": v for k, v in c.items()},
                "wasi weight ranks": {n: layer.rank for n, layer in self.layers.items()},
                "wasi searched ranks": {n: list(self.search[n][i].ranks) for n, i in self.choice.items()}}

    # ---- analytic counts ------------------------------------------------------------------------------------------
    def geometry(self, batch: Mapping[str, torch.Tensor]) -> dict[str, tuple[LinearGeometry, tuple[int, int]]]:
        """Each layer's geometry and (batch, tokens) of its input on `batch` (one no-grad forward of the task's
        loss; Tucker ranks not fixed yet are those `activation_epsilon` gives on this batch, nothing is stored)."""
        if self.finished:
            raise InvalidInputError("the WASI layers were turned back into nn.Linear at the end of training")
        seen = first_inputs(self.layers, lambda: self.task.loss(self.module, batch), keep=lambda x: as_3d(x.detach()))
        out = {}
        for name, layer in self.layers.items():
            a = seen[name]
            ranks = layer.activation_ranks
            if layer.activation is not None and ranks is None:
                ranks = tuple(hosvd_bases(a, epsilon=layer.activation.epsilon)[1])
            geo = LinearGeometry(layer.out_features, layer.in_features, layer.bias is not None, layer.weights,
                                 layer.activations, layer.rank or 0, ranks)
            out[name] = (geo, (a.shape[0], a.shape[1]))
        return out

    def analytic_memory(self, batch: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """The paper's analytic byte counts for one training step on `batch`, summed over the WASI layers (fp32):
        "activations" (what each layer's backward keeps of its input: the Tucker core and factors, or the input),
        "weights" (what the layers compute with: K (O + I) for L, R plus the bias; O I for a dense weight),
        "gradients" (one per trained number of these layers), "optimizer" (AdamW's two moments over the same,
        the loop's default optimizer; SGD without momentum holds none), "dense_master" (the paper variant's dense
        W, which it holds but the paper does not count), and the same five for a vanilla step of those layers
        ("vanilla_activations", ...). Other layers of the model are not counted (the paper's convention)."""
        totals = dict.fromkeys(("activations", "weights", "gradients", "optimizer", "dense_master"), 0)
        for key in list(totals):
            totals[f"vanilla_{key}"] = 0
        for geo, (b, n) in self.geometry(batch).values():
            vanilla = LinearGeometry(geo.out_features, geo.in_features, geo.bias, "vanilla")
            for prefix, g in (("", geo), ("vanilla_", vanilla)):
                m = memory_numel(g, b, n)
                for key, value in m.items():
                    totals[prefix + key] += 4 * value
                totals[prefix + "optimizer"] += 2 * 4 * m["gradients"]
        return totals

    def analytic_flops(self, batch: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """FLOPs of one step of the WASI layers on `batch` ("forward", "backward", "compression", "refresh") and of
        a vanilla step of the same layers ("vanilla_forward", "vanilla_backward") (`cost.training_flops`)."""
        totals = dict.fromkeys(("forward", "backward", "compression", "refresh", "vanilla_forward", "vanilla_backward"), 0)
        for geo, (b, n) in self.geometry(batch).values():
            for key, value in training_flops(geo, b, n).items():
                totals[key] += value
            plain = training_flops(LinearGeometry(geo.out_features, geo.in_features, geo.bias, "vanilla"), b, n)
            totals["vanilla_forward"] += plain["forward"]
            totals["vanilla_backward"] += plain["backward"]
        return totals


def build(module: nn.Module, task: Any, seed: int, config: WasiConfig | None = None, **options: Any) -> WasiProcedure:
    """Builder for `rankwise finetune --method full --procedure wasi` (options: WasiConfig's fields): swaps the
    target linears of `module` for WasiLinear layers in place (after the rank search, if `budget_mb` is given) and
    freezes the rest unless `train_others`. `seed` draws the calibration batch (the loop's first batch)."""
    config = config_or_options(WasiConfig, config, options, "wasi")
    targets = find_targets(module, config.targets)
    search, choice, ranks = {}, {}, {}
    if config.budget_mb is not None:
        n = min(config.calibration_examples, task.num_train)
        batch = task.batch(batch_indices(0, n, task.num_train, seed))
        search = measure_options(module, targets, lambda: task.loss(module, batch), config.epsilons)
        picks = choose_options([search[name] for name in targets], config.budget_mb * 2**20)
        choice = dict(zip(targets, picks))
        ranks = {name: search[name][i].ranks for name, i in choice.items()}
    if not config.train_others:
        head = getattr(module, "head", None)
        keep = {id(p) for p in head.parameters()} if isinstance(head, nn.Module) else set()
        for p in module.parameters():
            if id(p) not in keep:
                p.requires_grad_(False)
    layers = {}
    for name, linear in targets.items():
        linear.requires_grad_(True)  # what WASI trains, whatever the model's flags were
        layers[name] = WasiLinear.from_linear(linear, config.weight_form, config.activation_form, config.epsilon,
                                              config.activation_epsilon, ranks.get(name))
        _set(module, name, layers[name])
    return WasiProcedure(module, task, layers, config, search, choice)
