"""Training a CBM with the project's one loop (`core.training.train`): L = L_cls + L_concept + w * L_reg.

L_concept is the authors' code's reading: per group, cross-entropy of the group's scores against the annotated
value, averaged over groups (each group takes one value here). The optimiser is AdamW with two groups -- the
backbone at lr * backbone_lr_ratio, everything else (bridge, heads, Magnet queries, codebook) at lr: the codebook
and the queries are learnable, as the paper says (the released code leaves them out by a bug; `frozen_codebook`
reproduces that for the codebook). The effective rank of the patch features on a probe of validation images is
read before training and after every epoch (`RankProbe`, a loop procedure), so the "low-rank trap" is a curve.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.apps.vision.cbm.config import CBMConfig
from rankwise.apps.vision.cbm.metrics import LabelledConcepts, evaluate_cbm
from rankwise.apps.vision.cbm.model import ConceptBottleneckModel, check_images
from rankwise.core.training import TrainConfig, train
from rankwise.core.training.procedure import Procedure
from rankwise.errors import InvalidInputError
from rankwise.nn.ivq import patch_rank


class CBMTask:
    """The loop's Task: batches of images, classes and concepts; loss L_cls + L_concept + w L_reg; evaluation on
    the validation set (`evaluate_cbm`, metric class_acc)."""

    metric = "class_acc"
    higher_is_better = True

    def __init__(self, train_data: LabelledConcepts, val_data: LabelledConcepts, config: CBMConfig) -> None:
        self.train_data, self.val_data, self.config = train_data, val_data, config
        self.name = "cbm"

    @property
    def num_train(self) -> int:
        return len(self.train_data)

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        d = self.train_data
        return {"images": d.images[indices], "classes": d.classes[indices], "concepts": d.concepts[indices]}

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out = module.outputs(batch["images"])
        loss = F.cross_entropy(out.logits, batch["classes"])
        if not self.config.label_free:
            groups = module.group_scores(out.concept_scores)
            loss = loss + sum(F.cross_entropy(g, batch["concepts"][:, k]) for k, g in enumerate(groups)) / len(groups)
        return loss + self.config.reg_weight * out.reg_loss

    def evaluate(self, module: nn.Module) -> dict[str, float]:
        return evaluate_cbm(module, self.val_data)


class RankProbe(Procedure):
    """Reads `patch_rank` of the probe images' Z_p (eval mode) after every `every` steps."""

    name = "cbm-rank-probe"
    resumable = False

    def __init__(self, probe: torch.Tensor, every: int) -> None:
        self.probe, self.every = probe, max(1, every)
        self.curve: list[dict[str, float]] = []

    def read(self, module: nn.Module, epoch: int) -> None:
        if self.probe.shape[0] == 0:
            return
        was = module.training
        module.eval()
        with torch.no_grad():
            z = module.outputs(self.probe).patches
        module.train(was)
        self.curve.append({"epoch": epoch, **patch_rank(z).to_dict()})

    def after_step(self, step: int, module: nn.Module, task: Any, batch: Any) -> None:
        if (step + 1) % self.every == 0:
            self.read(module, (step + 1) // self.every)


def _optimizer(model: ConceptBottleneckModel, ratio: float):
    def make(module: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
        backbone = {id(p) for p in model.backbone_parameters()}
        rest = [p for p in module.parameters() if p.requires_grad and id(p) not in backbone]
        groups = [{"params": rest, "lr": config.lr}]
        if backbone and ratio > 0:
            groups.append({"params": model.backbone_parameters(), "lr": config.lr * ratio})
        return torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay)

    make.label = f"adamw-backbone-x{ratio:g}"  # type: ignore[attr-defined]
    return make


@dataclass
class CBMResult:
    """The trained model, its validation metrics, the rank curve (epoch 0 = before training), the loop's history."""

    model: ConceptBottleneckModel
    val: dict[str, float]
    rank_curve: list[dict[str, float]]
    steps: int
    seconds: float
    history: list[dict[str, float]] = field(default_factory=list, repr=False)


def fit_cbm(model: ConceptBottleneckModel, train_data: LabelledConcepts, val_data: LabelledConcepts) -> CBMResult:
    """Train `model` (its config gives the settings) on `train_data`; score on `val_data`. Input is checked first."""
    config = model.config
    for what, d in (("training data", train_data), ("validation data", val_data)):
        d.check(model.groups, what)
        check_images(d.images, model.backbone)
    num_classes = model.classifier.out_features
    if int(train_data.classes.max()) >= num_classes or int(train_data.classes.min()) < 0:
        raise InvalidInputError(f"class labels must be in 0..{num_classes - 1}")
    if config.backbone_lr_ratio == 0 and not config.freeze_backbone:
        for p in model.backbone.parameters():  # the loop trains what requires a gradient: freeze, do not ignore
            p.requires_grad_(False)
    steps_per_epoch = max(1, len(train_data) // config.batch_size)
    steps = config.epochs * steps_per_epoch
    probe = RankProbe(val_data.images[: config.rank_probe], steps_per_epoch)
    probe.read(model, 0)
    task = CBMTask(train_data, val_data, config)
    tc = TrainConfig(steps=steps, batch_size=config.batch_size, lr=config.lr, weight_decay=config.weight_decay,
                     warmup_ratio=config.warmup_ratio, max_grad_norm=1.0, seed=config.seed)
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        result = train(model, task, tc, optimizer=_optimizer(model, config.backbone_lr_ratio), procedure=probe)
    model.eval()
    return CBMResult(model, dict(result.final), probe.curve, steps, time.perf_counter() - t0, result.history)
