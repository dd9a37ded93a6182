"""Healing: a short recovery fine-tune of a converted MLA model, distilled from the original GQA model.

Loss (CARE's healing objective): L = CE(student, next token) + beta * tau^2 * KL(softmax(z_T / tau) || softmax(z_S / tau)),
averaged over tokens, the unconverted model as teacher. Only the new MLA parameters train (`kv_a_proj`, `k_up`,
`v_up`, `q_rope_proj`); embeddings, MLPs, norms, q_proj and o_proj stay as the original. AdamW (weight decay 0.01,
as in the card), linear warmup then cosine decay, computed from the step number alone so a resumed run follows the
same schedule. Batches are a fixed seeded permutation of training windows, indexed by step, so resuming from a
checkpoint replays exactly the same data: resume is bit-exact.

A checkpoint is one safetensors file (trainable parameters, AdamW moments and step counts) plus the step in its
metadata, written atomically every `checkpoint_every` steps. This is a small loop on purpose: `rankwise.training`
(the shared fine-tuning harness) had not landed when this was written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rankwise.compress.mla_deploy.build import mla_layers
from rankwise.core.io import load_tensors, save_tensors_atomic
from rankwise.core.progress import progress
from rankwise.errors import CorruptFileError, InvalidInputError, NumericalError

TRAINABLE = ("q_rope_proj", "kv_a_proj", "k_up", "v_up")
CHECKPOINT_NAME = "heal-checkpoint.safetensors"


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


@dataclass
class HealResult:
    start_step: int
    steps: int
    losses: list[float] = field(default_factory=list)  # total loss per step run in this call


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The MLA parameters healing trains, by their name in `model`."""
    wanted = {id(p) for attn in mla_layers(model) for n in TRAINABLE for p in getattr(attn, n).parameters()}
    return {n: p for n, p in model.named_parameters() if id(p) in wanted}


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor, beta: float, tau: float) -> torch.Tensor:
    """CE + beta tau^2 KL(teacher || student) at temperature tau, means over tokens. logits [B, T, V], targets [B, T]."""
    vocab = student_logits.size(-1)
    s, t = student_logits.reshape(-1, vocab).float(), teacher_logits.reshape(-1, vocab).float()
    ce = F.cross_entropy(s, targets.reshape(-1))
    kl = F.kl_div(F.log_softmax(s / tau, -1), F.log_softmax(t / tau, -1), log_target=True, reduction="batchmean")
    return ce + beta * tau**2 * kl


def learning_rate(step: int, cfg: HealConfig) -> float:
    warmup = max(1, round(cfg.warmup_ratio * cfg.steps))
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress_ = (step - warmup) / max(1, cfg.steps - warmup)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(progress_, 1.0)))


def _batch_order(num_windows: int, cfg: HealConfig) -> torch.Tensor:
    """Window indices for every step [steps, batch_size]: concatenated seeded permutations (epochs)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    needed = cfg.steps * cfg.batch_size
    order = torch.cat([torch.randperm(num_windows, generator=gen) for _ in range(math.ceil(needed / num_windows))])
    return order[:needed].view(cfg.steps, cfg.batch_size)


def save_checkpoint(path: str | Path, step: int, params: dict[str, nn.Parameter], optimizer: torch.optim.Optimizer) -> None:
    tensors = {f"param/{n}": p.detach() for n, p in params.items()}
    for n, p in params.items():
        state = optimizer.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq", "step"):
            if key in state:
                tensors[f"adam/{key}/{n}"] = torch.as_tensor(state[key]).detach().reshape(-1) if key == "step" else state[key].detach()
    save_tensors_atomic(path, tensors, metadata={"step": str(step), "kind": "rankwise-mla-heal", "version": "1"})


def load_checkpoint(path: str | Path, params: dict[str, nn.Parameter], optimizer: torch.optim.Optimizer) -> int:
    """Restore parameters and AdamW state in place; returns the number of steps already done."""
    from safetensors import safe_open

    tensors = load_tensors(path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("kind") != "rankwise-mla-heal" or "step" not in meta:
        raise CorruptFileError(f"{path} is not a rankwise MLA healing checkpoint")
    with torch.no_grad():
        for n, p in params.items():
            saved = tensors.get(f"param/{n}")
            if saved is None or saved.shape != p.shape:
                raise CorruptFileError(f"{path}: parameter {n} is missing or has the wrong shape; it belongs to another model")
            p.copy_(saved)
            if f"adam/exp_avg/{n}" in tensors:
                optimizer.state[p] = {
                    "step": tensors[f"adam/step/{n}"].reshape(()).clone(),
                    "exp_avg": tensors[f"adam/exp_avg/{n}"].clone(),
                    "exp_avg_sq": tensors[f"adam/exp_avg_sq/{n}"].clone(),
                }
    return int(meta["step"])


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
    `cfg.checkpoint_every` steps and at the end. `stop_after` ends the call after that many total steps (to
    simulate an interruption); the schedule still spans `cfg.steps`.
    """
    cfg = cfg or HealConfig()
    if windows.dim() != 2 or windows.size(0) < 1 or windows.size(1) < 2:
        raise InvalidInputError(f"healing needs token windows [N, T] with T >= 2, got shape {tuple(windows.shape)}")
    if cfg.steps < 1 or cfg.batch_size < 1 or cfg.lr <= 0 or cfg.tau <= 0 or cfg.beta < 0:
        raise InvalidInputError(f"bad healing settings {cfg}: steps, batch size, lr and tau must be positive, beta >= 0")
    params = trainable_parameters(student)
    flags = {p: p.requires_grad for p in student.parameters()}
    for p in student.parameters():
        p.requires_grad_(False)
    for p in params.values():
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(list(params.values()), lr=cfg.lr, weight_decay=cfg.weight_decay)
    path = None if checkpoint_dir is None else Path(checkpoint_dir) / CHECKPOINT_NAME
    start = load_checkpoint(path, params, optimizer) if path is not None and path.is_file() else 0
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    order = _batch_order(windows.size(0), cfg)
    result = HealResult(start_step=start, steps=end)
    teacher.eval()
    student.train()
    try:
        for step in progress(range(start, end), desc="healing", total=end - start):
            batch = windows[order[step]]
            with torch.no_grad():
                teacher_logits = teacher(input_ids=batch).logits[:, :-1]
            student_logits = student(input_ids=batch).logits[:, :-1]
            loss = distillation_loss(student_logits, teacher_logits, batch[:, 1:], cfg.beta, cfg.tau)
            if not torch.isfinite(loss):
                raise NumericalError(f"healing loss became {float(loss)} at step {step}; lower the learning rate")
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, cfg)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            result.losses.append(float(loss.detach()))
            if path is not None and ((step + 1) % cfg.checkpoint_every == 0 or step + 1 == end):
                save_checkpoint(path, step + 1, params, optimizer)
    finally:
        student.eval()
        for p, flag in flags.items():
            p.requires_grad_(flag)
    return result
