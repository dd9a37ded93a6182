"""What a CBM is scored on: class accuracy and balanced accuracy (BMAC), and concept accuracy and BMAC (the mean over
groups of each group's argmax accuracy / balanced accuracy), all in points; and the patch-feature ranks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.apps.vision.cbm.concepts import ConceptGroups
from rankwise.errors import InvalidInputError


@dataclass(frozen=True)
class LabelledConcepts:
    """images float [N, C, H, W] in [0, 1], classes int64 [N], concepts int64 [N, K] (value index per group)."""

    images: torch.Tensor
    classes: torch.Tensor
    concepts: torch.Tensor

    def check(self, groups: ConceptGroups, what: str) -> None:
        n = self.images.shape[0] if self.images.dim() else 0
        if n == 0:
            raise InvalidInputError(f"{what}: no images")
        if self.classes.dtype != torch.int64 or self.classes.shape != (n,):
            raise InvalidInputError(f"{what}: classes must be int64 [{n}], got {self.classes.dtype} {tuple(self.classes.shape)}")
        groups.check_labels(self.concepts, n, f"{what}: concepts")

    def __len__(self) -> int:
        return int(self.images.shape[0])


def balanced_accuracy(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Mean over the classes present in `target` of the per-class recall, in points."""
    recalls = [float((pred[target == c] == c).float().mean()) for c in torch.unique(target)]
    return 100.0 * sum(recalls) / len(recalls)


@torch.no_grad()
def evaluate_cbm(model, data: LabelledConcepts, batch_size: int = 256) -> dict[str, float]:
    """class_acc, class_bmac, concept_acc, concept_bmac (points) of `model` (a ConceptBottleneckModel) on `data`."""
    was = model.training
    model.eval()
    logits, scores = [], []
    for i in range(0, len(data), batch_size):
        out = model.outputs(data.images[i : i + batch_size])
        logits.append(out.logits)
        scores.append(out.concept_scores)
    model.train(was)
    pred = torch.cat(logits).argmax(-1)
    per_group = model.group_scores(torch.cat(scores))
    c_acc = [100.0 * float((g.argmax(-1) == data.concepts[:, k]).float().mean()) for k, g in enumerate(per_group)]
    c_bmac = [balanced_accuracy(g.argmax(-1), data.concepts[:, k]) for k, g in enumerate(per_group)]
    return {"class_acc": 100.0 * float((pred == data.classes).float().mean()), "class_bmac": balanced_accuracy(pred, data.classes),
            "concept_acc": sum(c_acc) / len(c_acc), "concept_bmac": sum(c_bmac) / len(c_bmac),
            **{f"concept_acc/{name}": a for name, a in zip(model.groups.names, c_acc)}}
