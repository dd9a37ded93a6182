"""A small, deterministic causal-LM pretraining loop, shared by optimizer comparisons.

Every optimizer sees the same batches in the same order (drawn from `seed`), the same learning-rate schedule
(linear warmup, then cosine decay to `min_lr_ratio` of the peak) and the same gradient clipping, so differences in
held-out loss come from the optimizer alone.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from rankwise.core.progress import progress
from rankwise.errors import InvalidInputError
from rankwise.eval.perplexity import perplexity


@dataclass
class PretrainRun:
    train_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, training loss of that batch)
    eval_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out mean NLL in nats/token)
    tokens_seen: int = 0
    wall_s: float = 0.0

    @property
    def final_eval_loss(self) -> float:
        return self.eval_curve[-1][1] if self.eval_curve else float("nan")


def warmup_cosine(step: int, total: int, warmup: int, min_lr_ratio: float) -> float:
    """Learning-rate multiplier at `step` (0-based): linear warmup over `warmup` steps, cosine to min_lr_ratio."""
    if step < warmup:
        return (step + 1) / warmup
    progress_frac = (step - warmup) / max(1, total - warmup)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress_frac)))


def pretrain_causal_lm(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    train_windows: torch.Tensor,
    eval_windows: torch.Tensor,
    *,
    steps: int,
    batch_size: int,
    eval_every: int,
    seed: int = 0,
    warmup_frac: float = 0.1,
    min_lr_ratio: float = 0.1,
    clip_norm: float | None = 1.0,
    desc: str = "pretrain",
) -> PretrainRun:
    """Train `model` (a causal LM taking input_ids and labels) on random batches of train_windows [N, T].

    Evaluates the mean next-token NLL on eval_windows [W, T] every `eval_every` steps and after the last step.
    The optimizer's per-group `lr` is the peak learning rate; the schedule scales it.
    """
    if train_windows.dim() != 2 or train_windows.size(0) < batch_size:
        raise InvalidInputError(f"train_windows must be [N, T] with N >= batch_size={batch_size}, got {tuple(train_windows.shape)}")
    if steps < 1 or eval_every < 1:
        raise InvalidInputError("steps and eval_every must be positive")
    warmup = max(1, int(warmup_frac * steps))
    peak_lrs = [g["lr"] for g in optimizer.param_groups]
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(train_windows.size(0), generator=gen)
    cursor = 0
    run = PretrainRun()
    t0 = time.perf_counter()
    model.train()
    for step in progress(range(steps), desc=desc):
        if cursor + batch_size > order.numel():  # next epoch, reshuffled
            order, cursor = torch.randperm(train_windows.size(0), generator=gen), 0
        batch = train_windows[order[cursor : cursor + batch_size]]
        cursor += batch_size
        scale = warmup_cosine(step, steps, warmup, min_lr_ratio)
        for group, peak in zip(optimizer.param_groups, peak_lrs):
            group["lr"] = peak * scale
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        run.train_curve.append((step + 1, loss.item()))
        run.tokens_seen += batch.numel()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            run.eval_curve.append((step + 1, perplexity(model, eval_windows, batch_size=8, desc="eval").mean_nll))
            model.train()
    for group, peak in zip(optimizer.param_groups, peak_lrs):
        group["lr"] = peak
    run.wall_s = time.perf_counter() - t0
    return run
