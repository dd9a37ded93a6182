"""Healing: a short recovery fine-tune of a converted MLA model, distilled from the original GQA model.

Loss (CARE's healing objective, `rankwise.training.distillation`): CE + beta * tau^2 * KL(teacher || student) at
temperature tau, the unconverted model as teacher. Only the new MLA parameters train (`kv_a_proj`, `k_up`, `v_up`,
`q_rope_proj`); embeddings, MLPs, norms, q_proj and o_proj stay as the original. The loop is the shared fine-tuning
harness (`rankwise.training.train`): AdamW (weight decay 0.01, as in the card), warmup then cosine, no gradient
clipping, checkpoints in `checkpoint_dir/checkpoint/` with bit-exact resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from rankwise.compress.mla_deploy.build import mla_layers
from rankwise.training import TrainConfig, train
from rankwise.training.distillation import DistillationTask, distillation_loss

__all__ = ["HealConfig", "HealResult", "heal", "trainable_parameters", "distillation_loss", "CHECKPOINT_NAME"]

TRAINABLE = ("q_rope_proj", "kv_a_proj", "k_up", "v_up")
CHECKPOINT_NAME = "checkpoint"  # the harness's checkpoint folder inside checkpoint_dir


@dataclass
class HealConfig:
    steps: int = 40
    batch_size: int = 4
    lr: float = 2e-4
    weight_decay: float = 0.01
    warmup_ratio: float = 0.05
    beta: float = 1.0  # weight of the distillation term (the paper does not give it)
    tau: float = 2.0  # distillation temperature (the paper does not give it)
    seed: int = 0
    checkpoint_every: int = 10

    def train_config(self) -> TrainConfig:
        return TrainConfig(steps=self.steps, batch_size=self.batch_size, lr=self.lr, weight_decay=self.weight_decay,
                           warmup_ratio=self.warmup_ratio, max_grad_norm=None, checkpoint_every=self.checkpoint_every,
                           seed=self.seed)


@dataclass
class HealResult:
    start_step: int
    steps: int  # the step this call stopped at
    losses: list[float] = field(default_factory=list)  # total loss per step run in this call


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The MLA parameters healing trains, by their name in `model`."""
    wanted = {id(p) for attn in mla_layers(model) for n in TRAINABLE for p in getattr(attn, n).parameters()}
    return {n: p for n, p in model.named_parameters() if id(p) in wanted}


def heal(
    student: nn.Module,
    teacher: nn.Module,
    windows: torch.Tensor,
    cfg: HealConfig | None = None,
    checkpoint_dir: str | Path | None = None,
    stop_after: int | None = None,
) -> HealResult:
    """Fine-tune `student`'s MLA parameters in place on token windows [N, T] with `teacher` as the distillation target.

    With `checkpoint_dir`, an existing checkpoint there is resumed (its step onward) and a new one is written every
    `cfg.checkpoint_every` steps. `stop_after` ends the call after that many total steps (a run in slices, or a
    simulated interruption); the schedule still spans `cfg.steps`.
    """
    cfg = cfg or HealConfig()
    task = DistillationTask(teacher, windows, beta=cfg.beta, tau=cfg.tau)
    task.name = "mla-healing"
    params = trainable_parameters(student)  # raises for a model without MLA layers
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
