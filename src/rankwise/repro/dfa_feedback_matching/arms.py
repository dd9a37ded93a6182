"""One fine-tuning run of an arm: the network, its new head, the procedure, the loop, and what is measured.

Every arm but DFA_scratch starts from the same point of its seed: the BP-pretrained FCN with a new 10-way head
fitted on the frozen features of the seed's digits training split (BP on the head alone = DFA on the head alone:
the card's reading for a new task). Then, before any fine-tuning step, the arm's matching is applied (none, FWM,
or an ablation) and the test accuracy, WA and GA are read; then `steps` steps of SGD (momentum 0.9) on the DFA
update (or the BP gradient for the BP arm), the same batches for every arm of a seed.
"""

from __future__ import annotations

import copy
import statistics as st
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rankwise.core.training import TrainConfig, train
from rankwise.core.training.tensor_tasks import TensorClassificationTask
from rankwise.errors import NumericalError
from rankwise.recipes.dfa import build


@dataclass(frozen=True)
class ArmSpec:
    """`matching`: the procedure's option (None: backprop); `decay`: whether the arm uses the tuned λ (else 0)."""

    label: str
    matching: str | None
    decay: bool
    scratch: bool = False


BP, DFA_FINE, DFA_SCRATCH, FWM, FWM_NO_WD, FEEDBACK_ONLY, WEIGHT_ONLY = (
    "BP", "DFA_fine", "DFA_scratch", "FWM", "FWM, no weight decay", "feedback matching only", "weight matching only")
ARMS: dict[str, ArmSpec] = {
    BP: ArmSpec(BP, None, False),
    DFA_FINE: ArmSpec(DFA_FINE, "none", False),
    DFA_SCRATCH: ArmSpec(DFA_SCRATCH, "none", False, scratch=True),
    FWM: ArmSpec(FWM, "fwm", True),
    FWM_NO_WD: ArmSpec(FWM_NO_WD, "fwm", False),
    FEEDBACK_ONLY: ArmSpec(FEEDBACK_ONLY, "feedback", True),
    WEIGHT_ONLY: ArmSpec(WEIGHT_ONLY, "weights", True),
}


@dataclass(frozen=True)
class Split:
    """One seed's digits (28x28): train, validation (tuning) and test images [N, 1, 28, 28] with labels [N]."""

    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class FineTune:
    steps: int
    batch: int
    momentum: float
    warmup_ratio: float
    eval_every: int
    head_steps: int
    head_lr: float


@dataclass
class RunResult:
    arm: str
    lr: float
    lam: float
    seed: int
    val_accuracy: float
    test_accuracy: float
    before_matching: float  # test accuracy of the starting point (head fitted), before matching
    after_matching: float  # ... right after the arm's matching, before any fine-tuning step
    ga_start: dict[str, float] = field(default_factory=dict)  # per hidden layer, t = 0 (on the first batch)
    wa_start: dict[str, float] = field(default_factory=dict)
    ga_end: dict[str, float] = field(default_factory=dict)  # on the last step's batch
    wa_end: dict[str, float] = field(default_factory=dict)
    val_curve: list[tuple[int, float]] = field(default_factory=list)
    feedback_change: float = 0.0  # max |F_end - F_start| over the DFA layers (0: fixed)
    head_ga: float = 1.0  # GA of the output layer at t = 0 (1: DFA's output update is BP's)
    matched_layers: int = 0
    diverged: bool = False

    @staticmethod
    def hidden_mean(values: dict[str, float]) -> float:
        hidden = [v for k, v in values.items() if k != "head"]
        return st.fmean(hidden) if hidden else float("nan")


def accuracy(module: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            return float((module(images).argmax(-1) == labels).double().mean())
    finally:
        module.train(was)


def sgd(momentum: float) -> Callable[[nn.Module, Any], torch.optim.Optimizer]:
    """SGD with momentum over the trainable parameters, no weight decay of its own (DFA's λ is in the update)."""

    def make(module: nn.Module, config: Any) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=config.lr, momentum=momentum)

    make.label = f"sgd(momentum={momentum})"  # type: ignore[attr-defined]
    return make


def with_fitted_head(pretrained: nn.Module, split: Split, seed: int, ft: FineTune) -> nn.Module:
    """The pretrained network with a new 10-way head (seeded) trained on its frozen features (AdamW, the loop)."""
    module = copy.deepcopy(pretrained)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module.head = nn.Linear(module.width, 10)
    with torch.no_grad():
        feats, feats_val = module.features(split.train[0]), module.features(split.val[0])
    task = TensorClassificationTask("digits-head", feats, split.train[1], feats_val, split.val[1])
    train(module.head, task, TrainConfig(steps=ft.head_steps, batch_size=128, lr=ft.head_lr, seed=seed))
    return module.requires_grad_(True).train()


def run_arm(arm: str, lr: float, lam: float, seed: int, start: nn.Module, fresh: Callable[[int], nn.Module],
            split: Split, ft: FineTune) -> RunResult:
    """Fine-tune arm `arm` at (lr, λ) from `start` (a copy is trained; DFA_scratch trains `fresh(seed)`)."""
    spec = ARMS[arm]
    module = fresh(seed) if spec.scratch else copy.deepcopy(start)
    module.requires_grad_(True).train()
    test = split.test
    before = accuracy(module, *test)
    task = TensorClassificationTask("digits-28", split.train[0], split.train[1], split.val[0], split.val[1])
    first = task.batch(torch.arange(min(ft.batch, task.num_train)))
    procedure = None
    result = RunResult(arm, lr, lam, seed, 0.0, 0.0, before, before)
    if spec.matching is not None:
        procedure = build(module, task, seed, matching=spec.matching, weight_decay=lam if spec.decay else 0.0,
                          alignment_every=ft.steps)
        result.after_matching = accuracy(module, *test)
        ga = procedure.gradient_alignment(task, first)
        result.head_ga = ga.pop("head")
        result.ga_start, result.wa_start = ga, procedure.weight_alignment()
        result.matched_layers = len(procedure.chain)
        feedback0 = [layer.feedback.clone() for layer in procedure.dfa_layers]
    config = TrainConfig(steps=ft.steps, batch_size=ft.batch, lr=lr, warmup_ratio=ft.warmup_ratio, max_grad_norm=None,
                         eval_every=ft.eval_every, seed=seed)
    try:
        out = train(module, task, config, optimizer=sgd(ft.momentum), procedure=procedure)
    except NumericalError:
        # A diverged run: never chosen on validation (NaN), and scored on test as the network it left (a NaN
        # output predicts one class), so a seed that diverges at the chosen rate counts against its arm.
        result.diverged = True
        result.val_accuracy, result.test_accuracy = float("nan"), accuracy(module, *test)
        return result
    result.val_accuracy = float(out.final["accuracy"])
    result.test_accuracy = accuracy(module, *test)
    result.val_curve = out.eval_curve("accuracy")
    if procedure is not None:
        last = procedure.alignment_log[-1]
        result.ga_end = {k: v for k, v in last["gradient"].items() if k != "head"}
        result.wa_end = procedure.final_weight_alignment
        result.feedback_change = max(float((layer.feedback - f0).abs().max())
                                     for layer, f0 in zip(procedure.dfa_layers, feedback0))
    return result
