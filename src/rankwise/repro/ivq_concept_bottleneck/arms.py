"""The arms of the reproduction (all on the same pretrained ViT, same epochs and batch) and one run of an arm."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from rankwise.apps.vision.cbm import CBMConfig, ConceptBottleneckModel, ConceptGroups, LabelledConcepts, evaluate_cbm, fit_cbm

# arm -> the CBM options that define it (everything else is the shared CBMConfig of the size)
ARMS: dict[str, dict] = {
    "cls-linear": {"pooling": "cls", "head": "linear", "regulariser": "none"},
    "magnet-only": {"pooling": "magnet", "regulariser": "none"},
    "ivq-magnet": {"pooling": "magnet", "regulariser": "ivq"},
    "explicit-vq": {"pooling": "magnet", "regulariser": "explicit-vq"},
    "spectral": {"pooling": "magnet", "regulariser": "spectral"},
    "lf-cbm": {"pooling": "cls", "head": "text", "regulariser": "none", "label_free": True, "freeze_backbone": True},
}
LABELS = {"cls-linear": "CLS + linear concept head", "magnet-only": "Magnet only (no IVQ)",
          "ivq-magnet": "IVQ + Magnet (the method)", "explicit-vq": "explicit VQ (Z_q forwarded) + Magnet",
          "spectral": "spectral regulariser + Magnet", "lf-cbm": "linear label-free CBM (frozen backbone)"}


@dataclass
class ArmRun:
    arm: str
    lr: float
    seed: int
    val: dict[str, float]
    test: dict[str, float]
    rank_curve: list[dict[str, float]]
    steps: int
    seconds: float
    trainable: int

    def rank(self, key: str = "cumulative") -> list[float]:
        return [r[key] for r in self.rank_curve]

    def final_rank_share(self, key: str = "cumulative") -> float:
        """The last epoch's rank as a percentage of the rank before fine-tuning."""
        r = self.rank(key)
        return 100.0 * r[-1] / r[0] if r and r[0] > 0 else float("nan")

    def rank_drop(self, key: str = "cumulative") -> float:
        """Percent of the pre-fine-tuning rank lost by the last epoch (positive = collapse)."""
        return 100.0 - self.final_rank_share(key)


def run_arm(arm: str, backbone: nn.Module, groups: ConceptGroups, train: LabelledConcepts, val: LabelledConcepts,
            test: LabelledConcepts, base: CBMConfig, lr: float, seed: int) -> ArmRun:
    """Fine-tune a fresh copy of `backbone` inside the arm's CBM (heads seeded by `seed`), score it on test."""
    config = dataclasses.replace(base, lr=lr, seed=seed, **ARMS[arm])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ConceptBottleneckModel(copy.deepcopy(backbone).train(), groups, int(train.classes.max()) + 1, config)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result = fit_cbm(model, train, val)
    return ArmRun(arm, lr, seed, result.val, evaluate_cbm(result.model, test), result.rank_curve, result.steps,
                  result.seconds, trainable)
