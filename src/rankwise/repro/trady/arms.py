"""The arms of the TraDy reproductions at one memory budget, and one training run of an arm.

Every sparse arm is the `trady` procedure with other options (the paper's naming: D- = redrawn every epoch, S- =
drawn once): TraDy = D-TopK Random (channels drawn uniformly from the ranked layers), S-TopK Random, D-/S-Full Random
(drawn from every layer), D-/S-Det RGN (the top-RGN channels of a full-gradient pass on training examples; the D-
version is the paper's oracle), Velocity (output neurons by NEq velocity, its own weight-only count of the same
budget). "full" is full fine-tuning (every parameter; the upper bound). All arms: SGD without momentum, warmup +
cosine, the same steps and batches, batch-norm statistics frozen; the new head trains densely in every arm.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rankwise.core.seed import set_seed
from rankwise.core.training import Procedure, TrainConfig, train
from rankwise.errors import NumericalError
from rankwise.recipes.trady import TradyConfig, build, sgd
from rankwise.recipes.trady.norms import batch_norms, freeze_statistics

CLIP = 1.0  # gradient-norm clipping in every arm (plain SGD on a new head can otherwise blow up at the larger rates)
SPARSE_ARMS: dict[str, dict[str, Any]] = {
    "trady": {"pool": "ranked", "selection": "random", "dynamic": True},
    "s-topk-random": {"pool": "ranked", "selection": "random", "dynamic": False},
    "d-full-random": {"pool": "all", "selection": "random", "dynamic": True},
    "s-full-random": {"pool": "all", "selection": "random", "dynamic": False},
    "d-det-rgn": {"pool": "all", "selection": "rgn", "dynamic": True},
    "s-det-rgn": {"pool": "all", "selection": "rgn", "dynamic": False},
    "velocity": {"pool": "all", "selection": "velocity", "dynamic": True},
}
LABELS = {"trady": "TraDy (D-TopK Random)", "s-topk-random": "S-TopK Random", "d-full-random": "D-Full Random",
          "s-full-random": "S-Full Random", "d-det-rgn": "D-Det RGN (oracle)", "s-det-rgn": "S-Det RGN",
          "velocity": "Velocity (NEq)", "full": "full fine-tuning"}


@dataclass
class ArmRun:
    """One trained arm: validation and test accuracy (points), the draws (TraDy's `history`), the time."""

    arm: str
    lr: float
    seed: int
    val: float
    test: float
    steps: int
    draws: list[dict[str, Any]] = field(default_factory=list)
    coverage: float = 1.0  # share of the pool's units updated at least once
    budget: int = 0  # B_mem in elements per example (0: full fine-tuning, no budget)
    seconds: float = 0.0


class _FrozenNorms(Procedure):
    """Full fine-tuning's only hook: batch-norm statistics frozen, as in every sparse arm."""

    name = "full-frozen-norms"

    def __init__(self, module: nn.Module) -> None:
        self.norms = batch_norms(module)

    def before_micro_batch(self, step: int, micro: int) -> None:
        freeze_statistics(self.norms)


def accuracy(logits_of: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor, chunk: int = 512) -> float:
    """Top-1 accuracy in points of `logits_of` on (x, y), in chunks, without gradients."""
    with torch.no_grad():
        pred = torch.cat([logits_of(x[i:i + chunk]).argmax(-1) for i in range(0, y.numel(), chunk)])
    return 100.0 * float((pred == y).double().mean())


def run_arm(arm: str, make_module: Callable[[], nn.Module], task: Any, test_accuracy: Callable[[nn.Module], float],
            lr: float, seed: int, steps: int, batch: int, budget: float, ranked: Sequence[str],
            epoch_steps: int, extra: dict[str, Any] | None = None) -> ArmRun:
    """Train `arm` on `task` from a fresh `make_module()` (the backbone with a new head, seeded by `seed`) and return
    its validation accuracy (the task's own evaluation, in points) and `test_accuracy`. `ranked`: the proxy ranking's
    kept layers (the TopK arms)."""
    import time

    set_seed(seed)
    module = make_module()
    config = TrainConfig(steps=steps, batch_size=batch, lr=lr, warmup_ratio=0.1, weight_decay=0.0, seed=seed,
                         max_grad_norm=CLIP)
    t0 = time.perf_counter()
    procedure: Procedure
    if arm == "full":
        module.requires_grad_(True)
        procedure = _FrozenNorms(module)
    else:
        spec = SPARSE_ARMS[arm]
        options = {"budget": budget, "selection": spec["selection"], "dynamic": spec["dynamic"],
                   "resample_every": epoch_steps, **(extra or {})}
        if spec["pool"] == "ranked":
            options["layers"] = tuple(ranked)
        procedure = build(module, task, seed, TradyConfig(**options))
    try:
        result = train(module, task, config, procedure=procedure, optimizer=sgd())
    except NumericalError:  # a diverged run is a result: a non-finite score, never chosen on validation
        return ArmRun(arm, lr, seed, math.nan, math.nan, steps, seconds=time.perf_counter() - t0)
    val, test = 100.0 * float(result.final["accuracy"]), test_accuracy(module)
    run = ArmRun(arm, lr, seed, val, test, steps, seconds=time.perf_counter() - t0)
    if arm != "full":
        run.draws, run.coverage, run.budget = list(procedure.history), procedure.coverage(), procedure.budget
    return run


def fresh(module: nn.Module) -> Callable[[], nn.Module]:
    """A factory of deep copies of `module` (the pretrained state is never trained in place)."""
    return lambda: copy.deepcopy(module)
