"""The models and training runs of the task-arithmetic-fairness reproduction: the tabular MLP, its pretraining on
the proxy label (theta_0), full fine-tuning, LoRA, and scoring a state on a split.

Every fine-tuning run uses one protocol (the paper's: the same epochs, batch and learning rate whatever the data):
`epochs` passes over the rows it is given, AdamW, batch min(batch, n), 10% warm-up then cosine, gradient clipping at
1. A subgroup model therefore takes ceil(epochs * n_g / batch) steps: the tiny groups get few steps and short vectors.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from rankwise.core.training import TrainConfig, TensorClassificationTask, train
from rankwise.recipes.task_arithmetic import FairnessMetrics, fairness_metrics


class TabularMLP(nn.Module):
    """features [B, F] -> logits [B, 2]: fc1 (F -> H), ReLU, fc2 (H -> H), ReLU, head (H -> 2)."""

    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(features, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


@dataclass(frozen=True)
class Part:
    """One split part: features [n, F], label [n], group codes [n], proxy label [n]."""

    x: torch.Tensor
    y: torch.Tensor
    g: torch.Tensor
    proxy: torch.Tensor


@dataclass(frozen=True)
class Split:
    train: Part
    val: Part
    test: Part
    group_names: tuple[str, ...]

    @property
    def num_groups(self) -> int:
        return len(self.group_names)


@dataclass(frozen=True)
class Protocol:
    epochs: int
    batch: int
    warmup_ratio: float = 0.1


def steps_for(n: int, protocol: Protocol) -> int:
    return max(1, math.ceil(protocol.epochs * n / min(protocol.batch, n)))


def fit(module: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, protocol: Protocol, seed: int,
        eval_part: Part) -> int:
    """Train `module`'s trainable parameters in place on (x, y) under `protocol`; returns the examples seen."""
    batch = min(protocol.batch, y.numel())
    steps = steps_for(y.numel(), protocol)
    task = TensorClassificationTask("compas", x, y, eval_part.x, eval_part.y)
    train(module, task, TrainConfig(steps=steps, batch_size=batch, lr=lr, warmup_ratio=protocol.warmup_ratio,
                                    seed=seed))
    return steps * batch


def pretrained_base(split: Split, hidden: int, lr: float, protocol: Protocol, seed: int) -> tuple[TabularMLP, float]:
    """theta_0: the MLP trained on the proxy label (COMPAS decile score >= 5) of the training rows, then its head
    re-initialised (seeded) and kept as part of theta_0. Returns it with its proxy validation accuracy."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TabularMLP(split.train.x.size(1), hidden)
    tr, va = split.train, split.val
    fit(model, tr.x, tr.proxy, lr, protocol, seed, Part(va.x, va.proxy, va.g, va.proxy))
    with torch.no_grad():
        proxy_accuracy = float((model(va.x).argmax(-1) == va.proxy).double().mean())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(50_000 + seed)
        model.head = nn.Linear(hidden, 2)
    return model.requires_grad_(True).train(), proxy_accuracy


def predict(module: nn.Module, state: dict[str, torch.Tensor] | None, x: torch.Tensor) -> torch.Tensor:
    """Binary predictions [n] of `module`, or of `state` loaded into a module of its architecture."""
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            logits = module(x) if state is None else functional_call(module, state, (x,))
    finally:
        module.train(was)
    return logits.argmax(-1)


def score(module: nn.Module, state: dict[str, torch.Tensor] | None, part: Part, num_groups: int) -> FairnessMetrics:
    return fairness_metrics(part.y, predict(module, state, part.x), part.g, num_groups)


def full_finetune(base: nn.Module, split: Split, lr: float, protocol: Protocol, seed: int) -> tuple[nn.Module, int]:
    model = copy.deepcopy(base)
    seen = fit(model, split.train.x, split.train.y, lr, protocol, seed, split.val)
    return model, seen


def lora_finetune(base: nn.Module, split: Split, lr: float, rank: int, protocol: Protocol, seed: int):
    """A peft LoRA model (rank r, alpha 2r, no dropout) on fc1, fc2 and head of a copy of theta_0, trained on all
    training rows. Returns (peft model, examples seen, trainable parameters)."""
    from peft import LoraConfig, get_peft_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(70_000 + seed)  # LoRA's A init
        model = get_peft_model(copy.deepcopy(base), LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                                               target_modules=["fc1", "fc2", "head"]))
    seen = fit(model, split.train.x, split.train.y, lr, protocol, seed, split.val)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return model, seen, trainable
