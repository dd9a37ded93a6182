"""TraDy as a training procedure: the layers chosen a priori (a ranking from a proxy task), then every epoch a new
uniform draw of input channels from those layers within the memory budget; only the drawn channels' weight slices
train, and only their activation slices are kept for the backward (`sparse_layers`).

    rankwise finetune --model minilm-l6 --task wiki-topics --method full --procedure trady \\
        --procedure-option budget=0.05 --procedure-option ranking=ranking.json --checkpoint-every 0 --out runs/trady

    procedure = build(module, task, seed, budget=0.05, ranking="ranking.json")
    train(module, task, TrainConfig(...), procedure=procedure, optimizer=sgd())

`build` does all the work that shapes memory: it measures each conv/linear layer's geometry with one forward, swaps
every eligible layer for a `ChannelSparse` one (the pool's layers with a trainable slice, the others frozen and
saving nothing for a weight gradient), freezes every other parameter except the `head` (trained densely, outside the
budget), and draws epoch 0's channels. A plain loop step is then TraDy's step. `end_of_training` puts the original
layers back, holding every update: the model saves and loads like any other.

The same procedure runs the paper's baselines at the same budget: `dynamic=False` keeps the first draw (S-), a pool of
every layer (no ranking) is "Full Random", `selection="rgn"` takes the top-RGN channels from a full-gradient pass on
`oracle_examples` training examples (once: S-Det RGN; every epoch: the D-Det RGN oracle), `selection="velocity"` is
Velocity (output neurons by NEq velocity, a weight-only budget; `velocity`).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from rankwise.core.module_inputs import first_inputs
from rankwise.core.options import config_or_options, option
from rankwise.core.training import Procedure, distributed
from rankwise.errors import InvalidInputError
from rankwise.recipes.trady.costs import (BYTES, INPUT, OUTPUT, LayerGeometry, eligible, find_layers, full_cost, in_head,
                                          measure_geometry, why_not_eligible)
from rankwise.recipes.trady.norms import batch_norms, freeze_statistics
from rankwise.recipes.trady.rgn import channel_rgn, load_ranking
from rankwise.recipes.trady.selection import UnitPool, draw_key, random_selection, top_score_selection
from rankwise.recipes.trady.sparse_layers import ChannelSparse, ProbeNorms, swap
from rankwise.recipes.trady.velocity import VelocityTracker, neuron_outputs

SELECTIONS = ("random", "rgn", "velocity")
CHUNK = 64  # examples per forward of the oracle and velocity passes
BANK = "trady_slices"  # the flat parameter of trained slices, registered on the trained module until the end


@dataclass(frozen=True)
class TradyConfig:
    """The memory budget (`budget`: a share of the full per-example cost Σ_i Σ_c Θ_space,c over every eligible
    layer, or `budget_elements` absolute), the layers channels are drawn from (`ranking`: a JSON of
    `rank_layers(...).save`, keeping the top layers up to `keep` of the total score; or `layers`: names, comma-
    separated; neither: every eligible layer), the selection rule, whether it is redrawn (`dynamic`) every epoch or
    every `resample_every` steps, and the densely trained `head` (a submodule name; "" for none)."""

    budget: float = 0.05
    budget_elements: int | None = None
    ranking: str | None = None
    keep: float = 0.97
    layers: str | tuple[str, ...] | None = None
    selection: str = field(default="random", metadata=option(choices=SELECTIONS))
    dynamic: bool = True
    resample_every: int | None = None
    head: str = "head"
    oracle_examples: int = 128
    velocity_examples: int = 128
    velocity_momentum: float = 0.5

    def validate(self) -> None:
        if not 0.0 < self.budget <= 1.0:
            raise InvalidInputError(f"trady budget is a share of the full training cost in (0, 1], got {self.budget}")
        if self.budget_elements is not None and self.budget_elements < 1:
            raise InvalidInputError(f"trady budget_elements must be a positive element count, got {self.budget_elements}")
        if not 0.0 < self.keep <= 1.0:
            raise InvalidInputError(f"trady keep is a share of the total layer score in (0, 1], got {self.keep}")
        if self.resample_every is not None and self.resample_every < 1:
            raise InvalidInputError(f"trady resample_every counts steps (>= 1), or None for once per epoch; got {self.resample_every}")
        if self.ranking is not None and self.layers is not None:
            raise InvalidInputError("trady takes a ranking (its top layers up to keep) or explicit layers, not both")
        if self.ranking is not None and not Path(self.ranking).is_file():
            raise InvalidInputError(f"trady ranking {self.ranking} is not a file: write one with "
                                    "rankwise.recipes.trady.rank_layers(proxy_module, proxy_task, ...).save(path)")
        for what in ("oracle_examples", "velocity_examples"):
            if getattr(self, what) < 1:
                raise InvalidInputError(f"trady {what} must be at least 1, got {getattr(self, what)}")
        if not 0.0 <= self.velocity_momentum < 1.0:
            raise InvalidInputError(f"trady velocity_momentum must lie in [0, 1), got {self.velocity_momentum}")
        _names(self.layers)


class TradyProcedure(Procedure):
    """The hooks: batch-norm statistics frozen before every micro-batch; at the first step of a new epoch (dynamic
    runs), the next draw. `history` records every draw (epoch, step, units, cost split)."""

    name = "trady"
    # Which units the flat parameter holds changes with every draw, and the dense weights the draws write back into
    # are buffers, not trainable parameters: a checkpoint (trainable parameters by name) cannot restore them.
    resumable = False

    def __init__(self, module: nn.Module, task: Any, seed: int, config: TradyConfig, geometries: dict[str, LayerGeometry],
                 pool_layers: list[str], budget: int, head: str) -> None:
        self.module, self.task, self.seed, self.config = module, task, seed, config
        self.geometries, self.pool_layers, self.budget, self.head = geometries, pool_layers, budget, head
        self.axis = OUTPUT if config.selection == "velocity" else INPUT
        self.pool = UnitPool.build(geometries, pool_layers, self.axis, weights_only=config.selection == "velocity")
        self.full_cost = full_cost(geometries)
        self.norms = batch_norms(module)
        self.flags = {p: p.requires_grad for p in module.parameters()}
        self.layers: dict[str, ChannelSparse] = {}
        for name in geometries:
            layer = module.get_submodule(name)
            self.layers[name] = ChannelSparse(layer, trainable=name in pool_layers, axis=self.axis)
        # The trained slices of every pool layer, back to back: a draw's weight part never exceeds the budget.
        self.bank = nn.Parameter(torch.zeros(budget, dtype=next(iter(self.layers.values())).weight.dtype))
        self.epoch, self.history = 0, []
        # Which units any draw so far has selected (the sub-networks' union: what resampling buys over one draw).
        self.updated = {n: torch.zeros(geometries[n].units(self.axis), dtype=torch.bool) for n in pool_layers}
        self.micro_batches, self.examples_per_step = 1, None
        self._stale: set[int] = set()  # ids of slices whose optimizer state belongs to the previous draw
        self._restored = False
        self._velocity = VelocityTracker(pool_layers, config.velocity_momentum) if config.selection == "velocity" else None
        self._velocity_examples = _draw_examples(task.num_train, config.velocity_examples, seed, -1)

    # ------------------------------------------------------------------------------------------------ set-up
    def install(self) -> None:
        """Swap the layers in, freeze everything but the slices and the head, draw epoch 0's units."""
        module = self.module
        if hasattr(module, BANK):
            raise InvalidInputError(f"{type(module).__name__} already has an attribute {BANK!r}: trady is installed twice?")
        module.requires_grad_(False)
        for n, m in module.named_modules():
            if in_head(n, self.head):
                m.requires_grad_(True)
        for name, layer in self.layers.items():
            swap(module, name, layer)
            if layer.trainable:
                layer.attach(self.bank)
        module.register_parameter(BANK, self.bank)
        if self._velocity is not None:
            self._velocity.observe(self._outputs())  # y_{-1}: the outputs before any update
        self._draw(0, 0)
        ref = weakref.ref(self)

        def drop_stale_state(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            procedure = ref()
            if procedure is not None and procedure._stale:
                for group in optimizer.param_groups:
                    for p in group["params"]:
                        if id(p) in procedure._stale:
                            optimizer.state.pop(p, None)  # a new sub-network starts with fresh moments
                procedure._stale.clear()

        # Any optimizer works: its per-parameter state of the previous draw (a shape that no longer fits) is dropped.
        self._hook = register_optimizer_step_pre_hook(drop_stale_state)

    # ------------------------------------------------------------------------------------------------ hooks
    def before_micro_batch(self, step: int, micro: int) -> None:
        freeze_statistics(self.norms)
        self.micro_batches = max(self.micro_batches, micro + 1)
        if micro == 0 and step > 0 and self.config.dynamic:
            epoch = self.epoch_at(step)
            if epoch != self.epoch:
                self._draw(epoch, step)

    def after_step(self, step: int, module: nn.Module, task: Any, batch: Mapping[str, torch.Tensor]) -> None:
        if self.examples_per_step is None:
            self.examples_per_step = _batch_size(batch) * self.micro_batches

    def end_of_training(self, module: nn.Module) -> None:
        """Put the original layers back (their weights hold every update) and the parameters' trainable flags as they
        were before `build`. Nothing is lost: the slices are written into the dense weights first."""
        if self._restored:
            return
        for name, layer in self.layers.items():
            swap(self.module, name, layer.restore())
        delattr(self.module, BANK)
        for p, flag in self.flags.items():
            p.requires_grad_(flag)
        self._hook.remove()
        self._restored = True

    def epoch_at(self, step: int) -> int:
        """The epoch (draw) step `step` belongs to: step // resample_every, or by examples seen over the task's size
        (the examples per step are read from the first step's batch and micro-batches)."""
        if self.config.resample_every is not None:
            return step // self.config.resample_every
        if self.examples_per_step is None:
            return self.epoch
        return step * self.examples_per_step // max(1, self.task.num_train)

    def describe(self) -> dict[str, Any]:
        return {"procedure": self.name, "selection": self.config.selection, "dynamic": self.config.dynamic,
                "budget_elements": self.budget, "budget_share": self.budget / self.full_cost,
                "pool_layers": list(self.pool_layers), "head": self.head, "resample_every": self.config.resample_every}

    # ------------------------------------------------------------------------------------------------ draws
    def _draw(self, epoch: int, step: int) -> None:
        rule = self.config.selection
        if rule == "random" or (rule == "velocity" and epoch == 0):
            positions = random_selection(self.pool, self.budget, self.seed, epoch)
        elif rule == "rgn":
            positions = top_score_selection(self.pool, self.pool.flat(self._oracle_rgn(epoch)), self.budget)
        else:
            velocity = self._velocity.observe(self._outputs())
            scores = {n: velocity[n].abs() / self.geometries[n].weight_cost(OUTPUT) for n in self.pool_layers}
            positions = top_score_selection(self.pool, self.pool.flat(scores), self.budget)
        chosen = self.pool.split(positions)
        for name in self.pool_layers:
            self.layers[name].sync()  # the last draw's slices back into the dense weights
        offset = 0
        with torch.no_grad():
            self.bank.zero_()
        for name in self.pool_layers:
            offset += self.layers[name].place(chosen[name], offset)
        if offset > self.bank.numel():  # costs include the weights, so a draw within the budget always fits
            raise RuntimeError(f"trady draw needs {offset} slice elements, the bank holds {self.bank.numel()}")
        for name in self.pool_layers:
            self.layers[name].mark_synced()
            self.updated[name][chosen[name]] = True
        self.bank.grad = None
        self._stale.add(id(self.bank))
        self.epoch = epoch
        self.history.append(self._entry(epoch, step, chosen))

    def coverage(self) -> float:
        """The share of the pool's units that some draw so far has selected."""
        return sum(int(u.sum()) for u in self.updated.values()) / max(1, sum(u.numel() for u in self.updated.values()))

    def selected(self) -> dict[str, torch.Tensor]:
        """The current draw: per pool layer, the trained unit indices (ascending)."""
        return {n: self.layers[n].index.clone() for n in self.pool_layers}

    def cost_of(self, chosen: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """Per-example element counts of a draw: the weight derivatives, the activations kept, their sum (the
        budgeted cost; for Velocity its own weight-only count is `budgeted`), and dW multiply-accumulates."""
        weights = activations = flops = 0
        for name, index in chosen.items():
            g, k = self.geometries[name], int(index.numel())
            weights += k * g.weight_cost(self.axis)
            if self.axis == INPUT:
                activations += k * g.activation_cost(INPUT)
                flops += g.dw_flops(k)
            elif k:
                activations += g.activation_cost(OUTPUT)
                flops += k * g.in_channels * g.kernel * g.out_positions
        budgeted = weights if self.config.selection == "velocity" else weights + activations
        return {"weights": weights, "activations": activations, "total": weights + activations, "budgeted": budgeted,
                "dw_macs": flops}

    def _entry(self, epoch: int, step: int, chosen: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        return {"epoch": epoch, "step": step, "units": sum(int(i.numel()) for i in chosen.values()),
                "layers_touched": sum(1 for i in chosen.values() if i.numel()), **self.cost_of(chosen)}

    # ------------------------------------------------------------------------------------------------ passes
    def _oracle_rgn(self, epoch: int) -> dict[str, torch.Tensor]:
        """Channel RGNs on `oracle_examples` training examples (a full weight gradient of every pool layer, computed
        by the sparse layers in probe mode; no parameter gradient is left behind)."""
        indices = _draw_examples(self.task.num_train, self.config.oracle_examples, self.seed, epoch)
        probes = {n: ProbeNorms(self.geometries[n].in_channels) for n in self.pool_layers}
        grads = {p: p.grad for p in self.module.parameters()}
        training = self.module.training
        self.module.eval()  # no dropout; batch-norm statistics are frozen anyway
        try:
            for n in self.pool_layers:
                self.layers[n].probe = probes[n]
            for part in indices.split(CHUNK):
                self.task.loss(self.module, self.task.batch(part)).backward()
        finally:
            for n in self.pool_layers:
                self.layers[n].probe = None
            for p, g in grads.items():
                p.grad = g
            self.module.train(training)
        return {n: channel_rgn(probes[n].mean(), self.geometries[n]) for n in self.pool_layers}

    def _outputs(self) -> dict[str, torch.Tensor]:
        """Every pool layer's outputs on the fixed velocity examples, as [N, C', P] or [N, C'] (Velocity's pass)."""
        got: dict[str, list[torch.Tensor]] = {n: [] for n in self.pool_layers}
        handles = [self.layers[n].register_forward_hook(lambda m, a, y, n=n: got[n].append(y.detach()))
                   for n in self.pool_layers]
        training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                for part in self._velocity_examples.split(CHUNK):
                    self.task.loss(self.module, self.task.batch(part))
        finally:
            for h in handles:
                h.remove()
            self.module.train(training)
        return {n: neuron_outputs(torch.cat(got[n]), self.geometries[n].kind) for n in self.pool_layers}

    # ------------------------------------------------------------------------------------------------ memory
    def analytic_memory(self, batch: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """The paper's analytic byte counts for one step on `batch` (fp32), at this batch's shapes:

        - "activations": what the selected units' weight derivatives need kept for the backward: B·H·W per selected
          input channel (linear: B·rows), or a layer's whole input B·C·H·W once one of its output neurons is selected
          (Velocity); exactly what the sparse layers save;
        - "gradients": the selected units' weight derivatives (C'·D·D per input channel, C·D·D per output neuron);
        - "optimizer": the optimizer state of the selected slices under the paper's SGD without momentum: 0 (AdamW
          would add 2 × "gradients");
        - "weights": every parameter and buffer the module holds (the dense weights, frozen biases and norms, the
          head and the trained slices): what any fine-tuning method holds, which the paper does not count;
        - "head_activations", "head_gradients": the densely trained head's input and weight gradient (outside the
          budget);
        - "budget_elements": B_mem, per-example elements (weight part once, activation part per example).
        """
        size = _batch_size(batch)
        head = self._head_module()
        shapes = self._input_shapes(batch, head)
        activations = gradients = 0
        for name in self.pool_layers:
            g, k = self.geometries[name], int(self.layers[name].index.numel())
            shape = shapes[name]
            positions = int(shape[-2] * shape[-1]) if g.kind == "conv" else math.prod(int(d) for d in shape[1:-1])
            gradients += k * g.weight_cost(self.axis) * BYTES
            if self.axis == INPUT:
                activations += size * k * positions * BYTES
            elif k:
                activations += size * g.in_channels * positions * BYTES
        weights = sum(t.numel() for t in self.module.parameters()) + sum(t.numel() for t in self.module.buffers())
        head_grads = sum(p.numel() for p in head.parameters() if p.requires_grad) if head is not None else 0
        return {"activations": activations, "gradients": gradients, "optimizer": 0, "weights": weights * BYTES,
                "head_activations": math.prod(shapes["head"]) * BYTES if "head" in shapes else 0,
                "head_gradients": head_grads * BYTES, "budget_elements": self.budget}

    def _input_shapes(self, batch: Mapping[str, torch.Tensor], head: nn.Module | None) -> dict[str, torch.Size]:
        """The input shape of every pool layer (and of the head, under "head") in one forward of `batch` (eval mode,
        no gradient: nothing is updated)."""
        targets = {n: self.layers[n] for n in self.pool_layers}
        if head is not None:
            targets["head"] = head
        training = self.module.training
        self.module.eval()
        try:
            return first_inputs(targets, lambda: self.task.loss(self.module, batch), keep=lambda x: x.shape)
        finally:
            self.module.train(training)

    def _head_module(self) -> nn.Module | None:
        if not self.head:
            return None
        try:
            return self.module.get_submodule(self.head)
        except AttributeError:
            return None


def build(module: nn.Module, task: Any, seed: int, config: TradyConfig | None = None, **options: Any) -> TradyProcedure:
    """Builder for `rankwise finetune --method full --procedure trady` (options: TradyConfig's fields). `module` is
    the task's wrapped model (backbone + head); it is changed in place (layers swapped, parameters frozen) until
    `end_of_training`."""
    config = config_or_options(TradyConfig, config, options, "trady")
    if distributed.world_size() > 1:
        raise InvalidInputError("trady's trained slices change shape at every draw, which data-parallel training "
                                "cannot follow: run it in one process")
    head = config.head
    names = find_layers(module, head)
    probe = torch.arange(min(2, task.num_train))
    geometries = measure_geometry(module, names, lambda: task.loss(module, task.batch(probe)), used_by_loss=True)
    if not geometries:
        raise InvalidInputError(f"{type(module).__name__} has no nn.Linear or nn.Conv2d layer outside {head!r} that the "
                                "task's loss depends on: trady has nothing to select channels from")
    pool = _pool(module, config, geometries)
    cost = full_cost(geometries)
    budget = config.budget_elements if config.budget_elements is not None else int(math.floor(config.budget * cost))
    weights_only = config.selection == "velocity"
    units = UnitPool.build(geometries, pool, OUTPUT if weights_only else INPUT, weights_only)
    cheapest = int(units.cost.min())
    if budget < cheapest:
        raise InvalidInputError(f"trady budget of {budget:,} elements ({budget / cost:.3%} of the full cost {cost:,}) fits "
                                f"no unit: the cheapest of the {len(pool)} pool layers costs {cheapest:,}; raise budget")
    procedure = TradyProcedure(module, task, seed, config, geometries, pool, budget, head)
    procedure.install()
    return procedure


def _pool(module: nn.Module, config: TradyConfig, geometries: dict[str, LayerGeometry]) -> list[str]:
    """The layers channels are drawn from, in module order: explicit names, a ranking's top layers, or all."""
    names = _names(config.layers)
    if names is not None and names != ["all"]:
        modules = dict(module.named_modules())
        for n in names:
            if n not in modules:
                raise InvalidInputError(f"trady layer {n!r} is not a submodule of {type(module).__name__}; eligible "
                                        f"layers are e.g. {list(geometries)[:3]}")
            if in_head(n, config.head):
                raise InvalidInputError(f"trady layer {n!r} is part of the head {config.head!r}, which trains densely")
            if not eligible(modules[n]):
                raise InvalidInputError(f"trady layer {n!r} is {why_not_eligible(modules[n])}: channels are drawn from "
                                        "nn.Linear and nn.Conv2d layers only")
            if n not in geometries:
                raise InvalidInputError(f"trady layer {n!r} is not reached by the task's loss (or its output is unused): it gets no gradient")
        return [n for n in geometries if n in set(names)]
    if config.ranking is not None:
        ranking = load_ranking(config.ranking)
        unknown = sorted(set(ranking.scores) - set(geometries))
        if unknown:
            raise InvalidInputError(f"the ranking {config.ranking} scores layers this model does not have (or its "
                                    f"forward does not reach): {unknown[:3]}; rank a proxy task on the same backbone")
        kept = set(ranking.select(config.keep))
        return [n for n in geometries if n in kept]
    return list(geometries)


def _names(layers: str | tuple[str, ...] | None) -> list[str] | None:
    if layers is None:
        return None
    names = [n.strip() for n in layers.split(",")] if isinstance(layers, str) else [str(n).strip() for n in layers]
    names = [n for n in names if n]
    if not names:
        raise InvalidInputError("trady layers: give module names (comma-separated) or 'all'")
    return names


def _batch_size(batch: Mapping[str, torch.Tensor]) -> int:
    for value in batch.values():
        if torch.is_tensor(value) and value.dim() > 0:
            return int(value.size(0))
    raise InvalidInputError("trady reads the batch size from the batch's tensors; this batch has none")


def _draw_examples(n: int, k: int, seed: int, epoch: int) -> torch.Tensor:
    """k training example indices (without replacement), a pure function of (seed, epoch)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(draw_key(seed + 7919, epoch)))
    return order[: min(k, n)]
