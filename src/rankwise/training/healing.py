"""Healing: a short recovery fine-tune of a converted model, distilled from the model it was converted from.

    result = heal(converted, original, train_windows, HealConfig(steps=40), checkpoint_dir="ckpt")

Loss (`rankwise.training.distillation`): CE + beta * tau^2 * KL(teacher || student) at temperature tau, the
unconverted model as teacher. Only the parameters the conversion introduced train (by default those of the student
whose names the teacher lacks; `trainable=` picks others); everything the conversion kept stays as the original.
The loop is the shared harness (`rankwise.training.train`): AdamW (weight decay 0.01), warmup then cosine, no
gradient clipping, checkpoints in `checkpoint_dir/checkpoint/` with bit-exact resume.

CARE's deployable MLA (`rankwise.compress.mla_deploy`) is the first user: its new parameters are `q_rope_proj`,
`kv_a_proj`, `k_up` and `v_up`; embeddings, MLPs, norms, q_proj and o_proj keep their names and stay frozen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.training.distillation import DistillationTask
from rankwise.core.training.loop import TrainConfig, train

__all__ = ["HealConfig", "HealResult", "heal", "new_parameters", "CHECKPOINT_NAME"]

CHECKPOINT_NAME = "checkpoint"  # the harness's checkpoint folder inside checkpoint_dir


@dataclass
class HealConfig:
    steps: int = 40
    batch_size: int = 4
    lr: float = 2e-4
    weight_decay: float = 0.01
    warmup_ratio: float = 0.05
    beta: float = 1.0  # weight of the distillation term (CARE's paper does not give it)
    tau: float = 2.0  # distillation temperature (CARE's paper does not give it)
    seed: int = 0
    checkpoint_every: int = 10
    autocast: str | None = None  # "bfloat16": the forward passes (teacher's too) in mixed precision (core.training.precision)

    def train_config(self) -> TrainConfig:
        return TrainConfig(steps=self.steps, batch_size=self.batch_size, lr=self.lr, weight_decay=self.weight_decay,
                           warmup_ratio=self.warmup_ratio, max_grad_norm=None, checkpoint_every=self.checkpoint_every,
                           seed=self.seed, autocast=self.autocast)


@dataclass
class HealResult:
    start_step: int
    steps: int  # the step this call stopped at
    losses: list[float] = field(default_factory=list)  # total loss per step run in this call


def new_parameters(student: nn.Module, teacher: nn.Module) -> dict[str, nn.Parameter]:
    """The student's parameters whose names the teacher lacks: the modules a conversion introduced."""
    known = {n for n, _ in teacher.named_parameters()}
    return {n: p for n, p in student.named_parameters() if n not in known}


def heal(
    student: nn.Module,
    teacher: nn.Module,
    windows: torch.Tensor,
    cfg: HealConfig | None = None,
    checkpoint_dir: str | Path | None = None,
    stop_after: int | None = None,
    trainable: Callable[[nn.Module], dict[str, nn.Parameter]] | None = None,
) -> HealResult:
    """Fine-tune `student`'s new parameters in place on token windows [N, T] with `teacher` as the distillation target.

    `trainable(student) -> {name: parameter}` chooses what trains (default: `new_parameters(student, teacher)`).
    With `checkpoint_dir`, an existing checkpoint there is resumed (its step onward) and a new one is written every
    `cfg.checkpoint_every` steps. `stop_after` ends the call after that many total steps (a run in slices, or a
    simulated interruption); the schedule still spans `cfg.steps`.
    """
    cfg = cfg or HealConfig()
    task = DistillationTask(teacher, windows, beta=cfg.beta, tau=cfg.tau)
    task.name = "healing"
    params = trainable(student) if trainable is not None else new_parameters(student, teacher)
    if not params:
        raise InvalidInputError(
            "nothing to heal: the student has no parameters the teacher lacks; heal a converted model (e.g. CARE's MLA "
            "from convert_to_deployable_mla) against its original, or pass trainable= to choose the parameters"
        )
    flags = {p: p.requires_grad for p in student.parameters()}
    student.requires_grad_(False)
    for p in params.values():
        p.requires_grad_(True)
    try:
        result = train(student, task, cfg.train_config(), out_dir=checkpoint_dir, stop_after=stop_after)
    finally:
        student.eval()
        for p, flag in flags.items():
            p.requires_grad_(flag)
    start = result.resumed_from or 0
    return HealResult(start_step=start, steps=result.steps, losses=[h["loss"] for h in result.history if h["step"] > start])
