"""The arms of the CAR-LoRA reproduction: one LoRA recipe, trained on different operator sets.

Every arm is a plain LoRA (same targets, rank, batch, schedule and seeds) trained with the car-lora procedure; the
set its base is drawn from and its number of steps differ:

  FP LoRA          {identity}: ordinary LoRA on θ₀ (the identity-only procedure is plain training, a unit test)
  per-operator C   {C}: the QLoRA-style upper bound, one adapter per operator, trained on C(θ₀) itself
  CAR-LoRA         the training operators, one drawn uniformly per micro-batch (trained longer, as in the paper)
  FP LoRA (long)   {identity} for as many steps as CAR-LoRA: separates "more training" from compression awareness

An arm's learning rate is chosen by its own training objective on the validation windows: the mean validation NLL
over its operator set (FP: on θ₀; per-operator: on C(θ₀); CAR: the average over its operators). A choice on the
grid's edge extends the grid by one point on that side (at the grid's ratio), up to `max_extensions` times.
Trained adapters are kept as tensors so they can be evaluated later on any base (compressed, drifted).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from rankwise.adapters import AdaptedModel, LoraConfig
from rankwise.recipes.car_lora import CompressedBase
from rankwise.core.arms import Selection, tune_then_seeds
from rankwise.core.seed import set_seed
from rankwise.training import TrainConfig, train
from rankwise.recipes.car_lora.procedure import CarLoraProcedure
from rankwise.training.top_layers_lm import CachedWindows, TopLayersLM

ADAPTER = "run"


@dataclass(frozen=True)
class ArmSpec:
    name: str
    operators: tuple[str, ...]  # the training set of the base
    steps: int


@dataclass
class Run:
    lr: float
    seed: int
    val_nll: float  # mean over the arm's operators
    state: dict[str, tuple[torch.Tensor, torch.Tensor]]  # module name -> (A [r, in], B [out, r])
    trainable: int
    counts: dict[str, int]  # micro-batches per operator


@dataclass
class ArmResult:
    spec: ArmSpec
    selection: Selection
    tuning: dict[float, Run] = field(default_factory=dict)
    seed_runs: list[Run] = field(default_factory=list)  # chosen lr, one per seed (the first is its tuning run)

    @property
    def lr(self) -> float:
        return float(self.selection.chosen)


class ArmRunner:
    """Trains arms on one adapted model (the adapter is added and deleted per run) and evaluates stored adapters."""

    def __init__(self, adapted: AdaptedModel, task: TopLayersLM, base: CompressedBase, lora: LoraConfig, batch: int) -> None:
        self.adapted, self.task, self.base, self.lora, self.batch = adapted, task, base, lora, batch

    def run(self, spec: ArmSpec, lr: float, seed: int) -> Run:
        set_seed(seed)  # LoRA's A init; the batch order follows TrainConfig.seed, the operators the procedure's seed
        self.adapted.add_adapter(ADAPTER, self.lora)
        try:
            trainable = self.adapted.count_parameters().trainable
            procedure = CarLoraProcedure(self.base, spec.operators, seed)
            train(self.adapted, self.task, TrainConfig(steps=spec.steps, batch_size=self.batch, lr=lr, seed=seed),
                  procedure=procedure)
            val = statistics.fmean(self.nll_under(op, self.task.eval_set) for op in spec.operators)
            state = {n: (a.A.detach().clone(), a.B.detach().clone()) for n, a in self.adapted.adapters_of(ADAPTER).items()}
            return Run(lr, seed, val, state, trainable, dict(procedure.counts))
        finally:
            self.adapted.delete_adapter(ADAPTER)

    def nll_under(self, op: str, data: CachedWindows, base: CompressedBase | None = None) -> float:
        with (base or self.base).using(op):
            return self.task.nll(data)

    def tune_and_run(self, spec: ArmSpec, grid: tuple[float, ...], seeds: list[int], max_extensions: int) -> ArmResult:
        """Choose the lr on validation (seed `seeds[0]`, grid extended off an edge), then run the other seeds at it."""
        tuned = tune_then_seeds(grid, lambda lr, seed: self.run(spec, lr, seed), seeds, score=lambda r: r.val_nll,
                                higher_is_better=False, max_extend=max_extensions, label=spec.name,
                                score_name="validation NLL")
        return ArmResult(spec, tuned.selection, tuned.runs, tuned.seed_runs)

    def evaluate(self, state: dict[str, tuple[torch.Tensor, torch.Tensor]], ops: list[str], data: CachedWindows,
                 base: CompressedBase | None = None) -> dict[str, float]:
        """Test NLL of a stored adapter under each operator of `base` (default: θ₀'s)."""
        self.adapted.add_adapter(ADAPTER, self.lora)
        try:
            with torch.no_grad():
                for n, a in self.adapted.adapters_of(ADAPTER).items():
                    a.A.copy_(state[n][0])
                    a.B.copy_(state[n][1])
            return {op: self.nll_under(op, data, base) for op in ops}
        finally:
            self.adapted.delete_adapter(ADAPTER)
