"""One LoRA placement (an arm) of the PLoP comparison: train it, tune its learning rate on validation, run its seeds.

Every arm trains LoRA (alpha = 2r, no dropout) on the same top layers, with the same steps, batch, schedule and seeds;
only its target module types, its rank (set to an equal trainable-parameter budget) and its learning rate differ.
The learning rate is chosen by validation NLL from a grid; a choice on the grid's edge extends the grid by one more
point on that side (at the grid's own ratio), up to `max_extensions` times, the same rule for every arm.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rankwise.adapters import AdaptedModel, LoraConfig
from rankwise.core.arms import Selection, tune_then_seeds
from rankwise.core.seed import set_seed
from rankwise.training import TrainConfig, train
from rankwise.training.top_layers_lm import CachedWindows, TopLayersLM


@dataclass(frozen=True)
class Placement:
    name: str
    targets: tuple[str, ...]  # target_modules (short names)
    rank: int


@dataclass
class RunResult:
    val_nll: float
    test_nll: float
    trainable: int
    final_train_loss: float


@dataclass
class ArmResult:
    placement: Placement
    selection: Selection
    runs_by_lr: dict[float, RunResult] = field(default_factory=dict)  # the tuning runs (seed = the first seed)
    seed_runs: list[RunResult] = field(default_factory=list)  # chosen lr, one per seed (the first is the tuning run)

    @property
    def lr(self) -> float:
        return float(self.selection.chosen)

    @property
    def trainable(self) -> int:
        return self.seed_runs[0].trainable


class ArmRunner:
    """Trains placements on one adapted model (adapters are added and deleted per run) and one cached task."""

    def __init__(self, adapted: AdaptedModel, task: TopLayersLM, test: CachedWindows, layers: list[int], steps: int, batch: int) -> None:
        self.adapted, self.task, self.test, self.layers, self.steps, self.batch = adapted, task, test, layers, steps, batch

    def run(self, placement: Placement, lr: float, seed: int) -> RunResult:
        """Train one placement at one learning rate and seed; validation and test NLL after the last step."""
        set_seed(seed)  # LoRA's A init; the batch order follows TrainConfig.seed
        config = LoraConfig(r=placement.rank, lora_alpha=2 * placement.rank, target_modules=list(placement.targets),
                            layers_to_transform=self.layers)
        self.adapted.add_adapter("run", config)
        try:
            trainable = self.adapted.count_parameters().trainable
            result = train(self.adapted, self.task, TrainConfig(steps=self.steps, batch_size=self.batch, lr=lr, seed=seed))
            return RunResult(val_nll=result.final["eval_loss"], test_nll=self.task.nll(self.test), trainable=trainable,
                             final_train_loss=result.losses[-1])
        finally:
            self.adapted.delete_adapter("run")

    def tune_and_run(self, placement: Placement, grid: tuple[float, ...], seeds: list[int], max_extensions: int) -> ArmResult:
        """Choose the lr on validation (seed `seeds[0]`, grid extended off an edge), then run the other seeds at it."""
        tuned = tune_then_seeds(grid, lambda lr, seed: self.run(placement, lr, seed), seeds, score=lambda r: r.val_nll,
                                higher_is_better=False, max_extend=max_extensions, label=placement.name,
                                score_name="validation NLL")
        return ArmResult(placement, tuned.selection, tuned.runs, tuned.seed_runs)
